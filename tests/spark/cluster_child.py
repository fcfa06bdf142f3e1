"""A streaming query whose driver runs in this process and whose executors run on the test
bed's Spark standalone cluster, for the executor-loss tests.

    python -m tests.spark.cluster_child PLAN.json

Executor mode: the tasks write Postgres, S3 and the files sink and prepare their parts; the
driver decides and commits. The plan holds `conf` (the cluster's `driver_conf()`), `dsn`,
`table`, `s3`, `files`, `job_id`, `source`, `checkpoint`, `partitions`, and optionally
`pause`: {"epoch": n, "flags": folder}. With a pause, the first task attempt of partition 0
of that epoch, once every sink has prepared its part, writes `paused-<n>.json` (its part
name and its Python worker's pid) into `flags` and sleeps, for the test to kill the executor
(or the whole worker) it runs on. Later attempts of that partition go through. With `hold`:
{"epoch": m, "flags": folder}, the driver touches `held-<m>` before batch m and waits (at
most 300 s) for the test to create `release-<m>`: the application stays up, no task of batch m
scheduled, e.g. while a lost worker comes back. With `die_in_commits`: {"epoch": n, "sink":
"postgres" | "s3", "after": k}, the driver SIGKILLs its process group (itself and its JVM) once
k of that sink's commits of epoch n returned (a Postgres COMMIT PREPARED, an S3
CompleteMultipartUpload), the others in flight or not begun. `background` runs the job with
`background_commits` (commits after the batch returned, beside the next batch's tasks).

Prints one JSON line at the end: {"error": ..., "batches": [...]}; exit 0 when the query
processed every file.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_sinks.core import CommitHandle, SinkConnector
from durable_sinks.sinks.postgres import committer as postgres_committer
from durable_sinks.sinks.s3 import committer as s3_committer
from durable_sinks.spark import DurableBatchWriter, JobOptions, SinkSpec
from tests.services import Testbed
from tests.spark.streams import run_available_now, source_stream
from tests.spark.wrapped import WrappedSink


class PausingSink(WrappedSink):
    """The wrapped sink, unchanged, except that the plan's task attempt stops after it
    prepared (see the module docstring)."""

    def pre_commit(self, epoch: int) -> CommitHandle:
        handle = self._inner.pre_commit(epoch)
        pause = self._plan.get("pause")
        if pause and epoch == pause["epoch"] and self._part.startswith("p0-"):
            flag = Path(pause["flags"]) / f"paused-{epoch}.json"
            try:
                with flag.open("x") as out:  # only the first attempt stops
                    json.dump({"part": self._part, "pid": os.getpid()}, out)
            except FileExistsError:
                return handle
            time.sleep(3600)  # until the test kills this executor
        return handle


@dataclass(frozen=True)
class PausingSpec(SinkSpec):
    """A sink spec whose sinks are PausingSinks (the last sink of the job only)."""

    plan: str = "{}"

    def build(self) -> SinkConnector:
        return PausingSink(super().build(), json.loads(self.plan))


class RecordingWriter(DurableBatchWriter):
    """The product's writer; remembers each batch's outcome for the report, and with a
    `hold` in the plan waits before that batch until the test releases it."""

    def __init__(self, plan: dict[str, Any], *args: Any) -> None:
        super().__init__(*args)
        self.plan = plan
        self.batches: list[dict[str, Any]] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        hold = self.plan.get("hold")
        if hold and int(batch_id) == hold["epoch"]:
            (Path(hold["flags"]) / f"held-{batch_id}").touch()
            release = Path(hold["flags"]) / f"release-{batch_id}"
            deadline = time.monotonic() + 300
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        super().__call__(df, batch_id)
        result = self.last_result
        if result is not None:
            self.batches.append(
                {
                    "epoch": int(batch_id),
                    "outcome": result.outcome.value,
                    "participants": sorted(p.participant for p in result.decision.handles),
                }
            )
        print(f"batch {batch_id} done", flush=True)


def die_in_commits(plan: dict[str, Any]) -> None:
    """Make the driver's commits of the plan's sink and epoch count themselves, and SIGKILL
    the driver's process group once `after` of them returned (see the module docstring)."""
    sink, epoch, after = plan["sink"], plan["epoch"], plan["after"]
    module, name = {
        "postgres": (postgres_committer, "commit_prepared"),
        "s3": (s3_committer, "_complete"),
    }[sink]
    original = getattr(module, name)
    returned = 0
    lock = threading.Lock()

    def commit_then_maybe_die(*args: Any, **kwargs: Any) -> Any:
        nonlocal returned
        outcome = original(*args, **kwargs)
        if args[2 if sink == "postgres" else 3] == epoch:
            with lock:
                returned += 1
                if returned == after:
                    print(f"killing after {after} {sink} commits of epoch {epoch}", flush=True)
                    os.killpg(os.getpgid(0), signal.SIGKILL)
        return outcome

    setattr(module, name, commit_then_maybe_die)


def main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    os.environ.update(plan["env"])  # PYSPARK_PYTHON for the executors' Python workers
    if plan.get("die_in_commits"):
        die_in_commits(plan["die_in_commits"])
    spark = Testbed.create().spark.session("durable-sinks-cluster-child", **plan["conf"])
    spark.sparkContext.setLogLevel("ERROR")
    pg = {"dsn": plan["dsn"], "table": plan["table"], "create_table": True}
    text = json.dumps(plan)
    sinks = [
        SinkSpec("postgres", pg),
        SinkSpec("s3", plan["s3"]),
        PausingSpec("files", {"path": plan["files"]}, plan=text),
    ]
    writer = RecordingWriter(
        plan,
        sinks,
        JobOptions(
            plan["job_id"], execution="executor", background_commits=bool(plan.get("background"))
        ),
    )
    stream = source_stream(spark, Path(plan["source"])).repartition(plan["partitions"])
    error: str | None = None
    try:
        run_available_now(stream, writer, Path(plan["checkpoint"]), plan.get("timeout", 400))
    except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
        error = f"{type(exc).__name__}: {exc}"
    writer.close()
    spark.stop()
    print(json.dumps({"error": error, "batches": writer.batches}), flush=True)
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
