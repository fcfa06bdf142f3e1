"""The soak: a streaming job on the test bed's Spark cluster under a random fault every ~20 s,
restarted whenever it stops, then drained and audited.

    python -m tests.soak [--minutes 30] [--interval 20] [--mode driver|executor] [--seed N]
                         [--replicated] [--own-servers OFFSET] [--progress 60]
    make soak                       (30 minutes; SOAK_ARGS="--minutes 5" for a shorter one)

The job (tests/soak/driver.py) writes Postgres and Kafka and S3 (the main bed's) in driver
mode; `--mode executor` writes Postgres, S3 and the files sink from the executors instead
(Kafka has no executor mode). Postgres and Kafka are the faults bed's, through Toxiproxy, or
with `--replicated` the three-broker Kafka cluster and the Postgres primary + synchronous
standby (tests/soak/beds.py). A feeder adds a JSON file of rows to the source every second.
Every ~`interval` s (+-25 %) one fault (each kind once per shuffled round): kill the driver,
kill an executor, and on the faults bed restart its Postgres or Kafka or cut a link
(tests/soak/faults.py); on the replicated servers kill the partition leader, the transaction
coordinator or the controller, restart the brokers one by one, restart the Postgres primary
or fail over to the standby (tests/soak/replicated.py). Whenever the driver process ends, the
soak starts it again from its checkpoint. At the end: feeding stops, the last driver is
killed, a drain run (availableNow) processes what is left, and the audit
(tests/soak/verdict.py) prints a table (also `verdict.md` in the run's folder, `.soak/<run>/`)
with each kind's count and pauses (tests/soak/pauses.py) and exits non-zero on any duplicate,
loss, leftover, or a kind injected fewer than `--min-per-kind` times. Every `--progress` s
while the faults go on, a progress line (tests/soak/progress.py): minutes done and left, rows
fed and landed in Postgres, faults injected, driver starts.

The soak holds the tests' locks on the servers it breaks for the whole run (tests/soak/beds.py
`held`); `--own-servers OFFSET` runs it on servers of its own instead (every port + OFFSET).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

from tests.services import Layout, Testbed, down, up
from tests.services._layout import REPO_ROOT
from tests.soak.beds import (
    FAULTS_BED_SERVICES,
    REPLICATED_SERVICES,
    Bed,
    faults_bed,
    held,
    replicated_bed,
)
from tests.soak.faults import Schedule, Target
from tests.soak.pauses import BatchLog, calm_batch
from tests.soak.progress import Reporter, Snapshot
from tests.soak.verdict import Audit, Tally
from tests.spark.streams import write_input
from tests.support.child_process import start_child
from tests.support.s3_target import s3_options

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
        self.started_at: list[float] = []  # wall clock of each start
        self.exits: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def launch(self, plan: dict[str, Any], name: str) -> subprocess.Popen[bytes]:
        return start_child("tests.soak.driver", plan, self.folder, name)[0]

    def run(self) -> None:
        while not self.stop.is_set():
            with self._lock:
                self.starts += 1
                self.started_at.append(time.time())
                self._proc = self.launch(self.plan, self.log_of(self.starts).stem)
            code = self._proc.wait()
            reason = "killed" if code == -signal.SIGKILL else f"exit {code}"
            self.exits[reason] = self.exits.get(reason, 0) + 1
            if not self.stop.is_set():
                why = "" if code == -signal.SIGKILL else last_error(self.log_of(self.starts))
                log(f"driver {self.starts} ended ({reason}{why}): starting it again")
                time.sleep(1)

    def log_of(self, start: int) -> Path:
        return self.folder / f"driver-{start:03d}.log"

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


def last_error(log_file: Path) -> str:
    """`: <the last error line of a driver's log>` (cut to 300 characters), or ''."""
    errors = [
        line.strip()
        for line in log_file.read_text(errors="replace").splitlines()
        if re.match(r"^[\w.]+(Error|Exception): ", line.strip())
    ]
    return f": {errors[-1][:300]}" if errors else ""


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=20.0, help="seconds between faults")
    parser.add_argument("--mode", choices=["driver", "executor"], default="driver")
    parser.add_argument(
        "--replicated",
        action="store_true",
        help="Kafka on the three-broker cluster, Postgres on the primary + synchronous standby",
    )
    parser.add_argument(
        "--own-servers",
        type=int,
        metavar="OFFSET",
        default=None,
        help="servers of the soak's own (every port + OFFSET, folders under "
        "<services>/soak-OFFSET), so a run neither waits for nor disturbs tests",
    )
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
    return parser.parse_args(argv)


def command(args: argparse.Namespace) -> str:
    """The command line that repeats this run (its seed included)."""
    words = [
        f"python -m tests.soak --minutes {args.minutes:g} --interval {args.interval:g}",
        f"--mode {args.mode}",
        *(["--replicated"] if args.replicated else []),
        *([f"--own-servers {args.own_servers}"] if args.own_servers is not None else []),
        f"--seed {args.seed}",
    ]
    return " ".join(words)


def testbed_of(args: argparse.Namespace) -> Testbed:
    """The shared test bed, or with `--own-servers` one of the soak's own."""
    layout = Layout.from_env()
    if args.own_servers is not None:
        layout = layout.shifted(args.own_servers, layout.root / f"soak-{args.own_servers}")
    return Testbed.create(layout)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    min_per_kind = args.min_per_kind or (5 if args.minutes >= 30 else 1)
    rng = random.Random(args.seed)
    run = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]
    folder = REPO_ROOT / ".soak" / run
    folder.mkdir(parents=True)
    every = f"a fault every ~{args.interval:g} s"
    servers = "the replicated servers" if args.replicated else "the faults bed"
    log(f"soak {run}: {args.minutes:g} min, {every}, {args.mode} mode, seed {args.seed}")
    log(f"on {servers}; folder {folder}")

    testbed = testbed_of(args)
    job_id, topic, schema = f"soak-{run}", f"soak-{run}", f"soak_{run.replace('-', '_')}"
    services = REPLICATED_SERVICES if args.replicated else FAULTS_BED_SERVICES
    log(f"starting {', '.join(services)}...")
    try:
        up(list(services), testbed)
        with held(testbed, replicated=args.replicated):
            bed = (
                replicated_bed(testbed, topic, job_id, rng, kafka=args.mode == "driver")
                if args.replicated
                else faults_bed(testbed)
            )
            bed.heal()
            return soak(args, bed, testbed, folder, (job_id, topic, schema), rng, min_per_kind)
    finally:
        if args.own_servers is not None:  # its own: stopped (their data kept for a look)
            down(list(services), testbed)


def soak(
    args: argparse.Namespace,
    bed: Bed,
    testbed: Testbed,
    folder: Path,
    names: tuple[str, str, str],
    rng: random.Random,
    min_per_kind: int,
) -> int:
    """The run itself, on servers started and held: faults, drain, audit."""
    job_id, topic, schema = names
    cluster = testbed.spark_cluster
    s3 = testbed.s3.endpoint()
    import psycopg  # (after `up`: the set-up's messages first)

    with psycopg.connect(bed.postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    bed.create_topic(topic)
    s3_path = f"s3://{s3.bucket}/soak/{folder.name}"
    plan: dict[str, Any] = {
        "conf": cluster.driver_conf(),
        "env": cluster.driver_env(),
        "dsn": bed.job_dsn,
        "table": f"{schema}.events",
        "bootstrap_servers": bed.job_bootstrap,
        "topic": topic,
        "s3": s3_options(s3, s3_path),
        "files": str(folder / "files"),
        "job_id": job_id,
        "source": str(folder / "in"),
        "checkpoint": str(folder / "checkpoint"),
        "batches": str(folder / "batches.log"),
        "mode": args.mode,
    }
    feeder = Feeder(folder / "in")
    supervisor = Supervisor(plan, folder)
    kinds = bed.kinds(Target(cluster, supervisor, rng))
    tally = Tally(kinds=list(kinds))
    schedule = Schedule(rng, list(kinds))
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
            done = kinds[kind]()
            if done is None:  # nothing to act on yet (a driver starting): the next kind
                tally.missed(kind)
                log(f"{kind}: nothing to act on now")
                continue
            tally.injected(kind, done)
            landed = audit.postgres_rows()
            log(
                f"fault {sum(tally.counts.values())}: {done.what}; "
                f"rows in Postgres so far: {landed}"
            )
    finally:
        reporter.stop.set()
        reporter.join()
        feeder.stop.set()
        feeder.join()
        supervisor.finish()
        bed.heal()  # every server up, nothing cut
    minutes = (time.monotonic() - started) / 60
    log(f"faults over after {minutes:.1f} min; {feeder.rows} rows fed; draining")
    drained = drain(supervisor, plan)
    batches = BatchLog(Path(plan["batches"])).batches()
    verdict = audit.verdict(
        expected=feeder.rows,
        tally=tally,
        min_per_kind=min_per_kind,
        batches=batches,
        starts=supervisor.started_at,
    )
    verdict.rows.append(drained)
    calm = calm_batch(batches)
    verdict.extra = {
        "driver starts": supervisor.starts,
        "driver exits": ", ".join(f"{k} x{v}" for k, v in sorted(supervisor.exits.items())),
        "batches": f"{len(batches)}; a batch's write took {calm:.1f} s (median)"
        if calm is not None
        else "0",
        "command": command(args),
    }
    table = verdict.markdown()
    (folder / "verdict.md").write_text(table)
    print("\n" + table, flush=True)
    log(f"verdict: {'PASS' if verdict.passed else 'FAIL'} (also in {folder / 'verdict.md'})")
    return 0 if verdict.passed else 1


def drain(supervisor: Supervisor, plan: dict[str, Any], attempts: int = 3) -> tuple[str, str, bool]:
    """The last run: every file not yet processed, availableNow; the verdict's row of it
    (how long it took, or that it failed: the audit then shows what the sinks hold)."""
    start = time.monotonic()
    for attempt in range(1, attempts + 1):
        proc = supervisor.launch({**plan, "drain": True}, f"drain-{attempt}")
        if proc.wait() == 0:
            return ("drain run", f"{time.monotonic() - start:.0f} s", True)
        log(f"drain run {attempt} failed (see drain-{attempt}.log)")
    return ("drain run", f"failed {attempts} times (drain-1.log .. drain-{attempts}.log)", False)


if __name__ == "__main__":
    sys.exit(main())
