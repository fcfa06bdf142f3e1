"""A real Spark streaming query in its own process, for the Spark crash tests.

    python -m tests.spark.crash_child PLAN.json

The query reads the JSON files of `source` (one file per batch) and writes them through
`durable_sink` into Postgres and Kafka (one atomic job) with `checkpoint` as its Spark
checkpoint. With a kill in the plan, the process SIGKILLs its whole process group (the Python
driver and Spark's JVM: the driver machine dies) at that moment of batch `kill_epoch`:

- `step:<name>`: right after the coordinator step `<name>` (prefix match): inside `fn`, e.g.
  after a sink's write, after the decision (Kafka committed, Postgres not yet), between
  commits;
- `after-fn`: after `fn` returned, before Spark writes the batch's commit log entry;
- `recovery:<name>`: during the coordinator's start-up recovery (any epoch).

Without a kill the query runs until every file is processed (availableNow) and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from coordinator.spark import DurableBatchWriter, JobOptions, sink
from tests.services import Testbed
from tests.spark.streams import run_available_now, source_stream


def die() -> None:
    sys.stdout.flush()
    os.killpg(os.getpgid(0), signal.SIGKILL)


class CrashingWriter(DurableBatchWriter):
    """The product's writer, with a SIGKILL at the plan's moment."""

    def __init__(self, plan: dict[str, Any], *args: Any) -> None:
        self.plan = plan
        self.epoch: int | None = None
        super().__init__(*args)

    def _on_step(self, step: str) -> None:
        kill = str(self.plan.get("kill") or "")
        if kill.startswith("recovery:") and step.startswith(kill):
            print(f"killing at {step}", flush=True)
            die()
        in_batch = kill.startswith("step:") and self.epoch == self.plan["kill_epoch"]
        if in_batch and step.startswith(kill.removeprefix("step:")):
            print(f"killing at {step} of epoch {self.epoch}", flush=True)
            die()

    def __call__(self, df: Any, batch_id: int) -> None:
        self.epoch = int(batch_id)
        print(f"batch {batch_id}", flush=True)
        super().__call__(df, batch_id)
        if self.plan.get("kill") == "after-fn" and self.epoch == self.plan["kill_epoch"]:
            print(f"killing after fn of epoch {self.epoch}", flush=True)
            die()


def main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    spark = Testbed.create().spark.session("durable-sinks-crash-child")
    spark.sparkContext.setLogLevel("ERROR")
    sinks = [
        sink("postgres", dsn=plan["dsn"], table=plan["table"], create_table=True),
        sink(
            "kafka",
            bootstrap_servers=plan["bootstrap_servers"],
            topic=plan["topic"],
            request_timeout_s=20,
        ),
    ]
    writer = CrashingWriter(plan, sinks, JobOptions(plan["job_id"]))
    print("started", flush=True)
    run_available_now(
        source_stream(spark, Path(plan["source"])), writer, Path(plan["checkpoint"]), 600
    )
    writer.close()
    spark.stop()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
