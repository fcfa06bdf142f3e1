"""The soak: a streaming job on the test bed's Spark cluster under a random fault every ~20 s,
restarted whenever it stops, then drained and audited.

    python -m tests.soak [--minutes 30] [--interval 20] [--mode driver|executor] [--seed N]
                         [--progress 60]
    make soak                       (30 minutes; SOAK_ARGS="--minutes 5" for a shorter one)

The job (tests/soak/driver.py) writes Postgres and Kafka (the faults bed's, through Toxiproxy)
and S3 (the main bed's) in driver mode; `--mode executor` writes Postgres, S3 and the files
sink from the executors instead (Kafka has no executor mode). A feeder adds a JSON file of
rows to the source every second. Every ~`interval` s (+-25 %) one fault of tests/soak/faults.py
(each kind once per shuffled round): kill the driver, kill an executor, restart the faults
Postgres or Kafka, cut a link. Whenever the driver process ends, the soak starts it again
from its checkpoint. At the end: feeding stops, the last driver is killed, a drain run
(availableNow) processes what is left, and the audit (tests/soak/verdict.py) prints a table
(also `verdict.md` in the run's folder, `.soak/<run>/`) and exits non-zero on any duplicate,
loss, leftover, or a kind injected fewer than `--min-per-kind` times. Every `--progress` s
while the faults go on, a progress line (tests/soak/progress.py): minutes done and left, rows
fed and landed in Postgres, faults injected, driver starts.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

from tests.services import Testbed, up
from tests.services._layout import REPO_ROOT
from tests.soak.faults import KINDS, Schedule, Target
from tests.soak.progress import Reporter, Snapshot
from tests.soak.verdict import Audit, Tally
from tests.spark.streams import write_input
from tests.support.child_process import start_child
from tests.support.fault_bed import FaultBed
from tests.support.s3_target import s3_options
from tests.support.targets import create_topic

ROWS_PER_FILE = 25


def log(message: str, out: TextIO = sys.stdout) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=out, flush=True)


class Feeder(threading.Thread):
    """Adds one file of ROWS_PER_FILE new ids to the source every `every` seconds."""

    def __init__(self, folder: Path, every: float = 1.0) -> None:
        super().__init__(name="soak-feeder", daemon=True)
        self.folder, self.every, self.files = folder, every, 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            start = self.files * ROWS_PER_FILE
            write_input(
                self.folder, f"part-{self.files:06d}.json", range(start, start + ROWS_PER_FILE)
            )
            self.files += 1

    @property
    def rows(self) -> int:
        return self.files * ROWS_PER_FILE


class Supervisor(threading.Thread):
    """Keeps one driver process running: starts it again whenever it ends (killed, or its
    query failed), until `stop` is set."""

    def __init__(self, plan: dict[str, Any], folder: Path) -> None:
        super().__init__(name="soak-supervisor", daemon=True)
        self.plan, self.folder = plan, folder
        self.stop = threading.Event()
        self.starts = 0
        self.exits: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def launch(self, plan: dict[str, Any], name: str) -> subprocess.Popen[bytes]:
        return start_child("tests.soak.driver", plan, self.folder, name)[0]

    def run(self) -> None:
        while not self.stop.is_set():
            with self._lock:
                self.starts += 1
                self._proc = self.launch(self.plan, f"driver-{self.starts:03d}")
            code = self._proc.wait()
            reason = "killed" if code == -signal.SIGKILL else f"exit {code}"
            self.exits[reason] = self.exits.get(reason, 0) + 1
            if not self.stop.is_set():
                log(f"driver {self.starts} ended ({reason}): starting it again")
                time.sleep(1)

    def kill(self) -> bool:
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                return False
            os.killpg(proc.pid, signal.SIGKILL)
            return True

    def finish(self) -> None:
        self.stop.set()
        self.kill()
        self.join(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=20.0, help="seconds between faults")
    parser.add_argument("--mode", choices=["driver", "executor"], default="driver")
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(10**6))
    parser.add_argument(
        "--progress", type=float, default=60.0, help="seconds between progress lines"
    )
    parser.add_argument(
        "--min-per-kind",
        type=int,
        default=None,
        help="fail unless every kind was injected this often (default 5 from 30 minutes, else 1)",
    )
    args = parser.parse_args(argv)
    min_per_kind = args.min_per_kind or (5 if args.minutes >= 30 else 1)
    rng = random.Random(args.seed)
    run = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]
    folder = REPO_ROOT / ".soak" / run
    folder.mkdir(parents=True)
    every = f"a fault every ~{args.interval:g} s"
    log(f"soak {run}: {args.minutes:g} min, {every}, {args.mode} mode, seed {args.seed}")
    log(f"folder {folder}")

    testbed = Testbed.create()
    log("starting the faults bed, S3 and the Spark cluster...")
    up(["faults", "s3", "spark", "spark-cluster"], testbed)
    bed = FaultBed.of(testbed)
    bed.prepare()
    cluster = testbed.spark_cluster
    s3 = testbed.s3.endpoint()
    job_id, topic, schema = f"soak-{run}", f"soak-{run}", f"soak_{run.replace('-', '_')}"
    import psycopg  # (after `up`: the set-up's messages first)
    from confluent_kafka.admin import AdminClient

    with psycopg.connect(bed.postgres_direct.conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    create_topic(AdminClient(bed.kafka_direct.config()), topic)
    s3_path = f"s3://{s3.bucket}/soak/{run}"
    plan: dict[str, Any] = {
        "conf": cluster.driver_conf(),
        "env": cluster.driver_env(),
        "dsn": bed.postgres_proxied.conninfo(),
        "table": f"{schema}.events",
        "bootstrap_servers": bed.kafka_proxied.bootstrap_servers,
        "topic": topic,
        "s3": s3_options(s3, s3_path),
        "files": str(folder / "files"),
        "job_id": job_id,
        "source": str(folder / "in"),
        "checkpoint": str(folder / "checkpoint"),
        "mode": args.mode,
    }
    feeder = Feeder(folder / "in")
    supervisor = Supervisor(plan, folder)
    tally = Tally(kinds=list(KINDS))
    target = Target(bed, cluster, supervisor, rng)
    schedule = Schedule(rng)
    audit = Audit(bed, s3, plan, folder)
    feeder.start()
    supervisor.start()
    started = time.monotonic()
    deadline = started + args.minutes * 60

    def snapshot() -> Snapshot:
        return Snapshot(
            elapsed=time.monotonic() - started,
            total=args.minutes * 60,
            fed=feeder.rows,
            landed=audit.postgres_rows(),
            faults=sum(tally.counts.values()),
            missed=sum(tally.skipped.values()),
            starts=supervisor.starts,
        )

    reporter = Reporter(args.progress, snapshot, log)
    reporter.start()
    try:
        while True:
            wait = args.interval * rng.uniform(0.75, 1.25)
            if time.monotonic() + wait > deadline:
                break
            time.sleep(wait)
            kind = schedule.next()
            done = KINDS[kind](target)
            if done is None:  # nothing to act on yet (a driver starting): the next kind
                tally.missed(kind)
                log(f"{kind}: nothing to act on now")
                continue
            tally.injected(kind, done)
            landed = audit.postgres_rows()
            log(f"fault {sum(tally.counts.values())}: {done}; rows in Postgres so far: {landed}")
    finally:
        reporter.stop.set()
        reporter.join()
        feeder.stop.set()
        feeder.join()
        supervisor.finish()
        bed.prepare()  # every server up, every proxy on, no toxic
    minutes = (time.monotonic() - started) / 60
    log(f"faults over after {minutes:.1f} min; {feeder.rows} rows fed; draining")
    drained_in = drain(supervisor, plan)
    verdict = audit.verdict(expected=feeder.rows, tally=tally, min_per_kind=min_per_kind)
    verdict.extra = {
        "driver starts": supervisor.starts,
        "driver exits": ", ".join(f"{k} x{v}" for k, v in sorted(supervisor.exits.items())),
        "drain run": f"{drained_in:.0f} s",
        "command": f"python -m tests.soak --minutes {args.minutes:g} --interval {args.interval:g} "
        f"--mode {args.mode} --seed {args.seed}",
    }
    table = verdict.markdown()
    (folder / "verdict.md").write_text(table)
    print("\n" + table, flush=True)
    log(f"verdict: {'PASS' if verdict.passed else 'FAIL'} (also in {folder / 'verdict.md'})")
    return 0 if verdict.passed else 1


def drain(supervisor: Supervisor, plan: dict[str, Any], attempts: int = 3) -> float:
    """The last run: every file not yet processed, availableNow; seconds it took."""
    start = time.monotonic()
    for attempt in range(1, attempts + 1):
        proc = supervisor.launch({**plan, "drain": True}, f"drain-{attempt}")
        if proc.wait() == 0:
            return time.monotonic() - start
        log(f"drain run {attempt} failed (see drain-{attempt}.log)")
    raise SystemExit(f"the drain run failed {attempts} times; see {supervisor.folder}")


if __name__ == "__main__":
    sys.exit(main())
