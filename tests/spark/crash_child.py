"""A real Spark streaming query in its own process, for the Spark crash tests.

    python -m tests.spark.crash_child PLAN.json

The query reads the JSON files of `source` (one file per batch) and writes them through
`durable_sink` into Postgres, S3, a Delta table, an Iceberg table (`iceberg`: the sink's
options) and Kafka (one atomic job) with `checkpoint` as its Spark checkpoint. With a kill
in the plan, the process SIGKILLs its whole process group (the Python driver and Spark's JVM:
the driver machine dies) at that moment of batch `kill_epoch`:

- `step:<name>`: right after the coordinator step `<name>` (prefix match): inside `fn`, e.g.
  after a sink's write, after the decision (Kafka committed, Postgres not yet), between
  commits;
- `after-fn`: after `fn` returned, before Spark writes the batch's commit log entry;
- `recovery:<name>`: during the coordinator's start-up recovery (any epoch).

- `task:after-prepare` (executor mode): inside a Spark task, right after its part is
  prepared, before its handle reaches the driver.

Executor mode (`"mode": "executor"`) writes Postgres, S3, Delta, Iceberg and the files sink
from the tasks, on
`local[2,3]` (tasks are retried), and the first attempt of partition 0 of every even batch
dies right after preparing (its Python worker exits): a prepared attempt that the driver's
decision must leave out and roll back.

`"mode": "kafka-alone"` and `"mode": "delta-alone"` write that one sink in driver mode and
name no decision store: Kafka keeps the job's decisions in its progress topic, a Delta table
in its folder's `_decisions`. `"mode": "kafka-routed"` is Kafka alone without a topic option:
row n goes to `topics[n % 3]` by its `topic` column (Spark's record shape), the third topic
made when a row first names it; with `dead_letter_topic`, every 7th row names a topic outside
the sink's bounds and goes to that Kafka dead-letter topic, in the same transaction.
`"mode": "two-kafka"` writes Postgres and two Kafka topics of one cluster (`topic`,
`audit_topic`), which share one Kafka transaction per epoch.

With `"bad_rows": true` (driver or executor mode) the source is tests/spark/bad_rows.py's
stream, which carries rows of every kind the Postgres table refuses, and the job writes that
one table with `on_bad_rows="dead_letter"` into the Postgres dead-letter table
`dead_letter_table` (executor mode: the table's sink is the one whose task dies after
preparing).

Without a kill the query runs until every file is processed (availableNow) and exits 0.
`"trace": true` prints every coordinator step (to find the step names of a new job shape).
With `"target": "cluster"` the executors run on the test bed's Spark standalone cluster
instead of `local[2]` / `local[2,3]` (Spark retries failed tasks there by default).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_sinks.core import CommitHandle, SinkConnector
from durable_sinks.spark import DurableBatchWriter, JobOptions, SinkSpec, sink
from durable_sinks.spark._options import Execution
from tests.services import Testbed
from tests.spark import bad_rows
from tests.spark.streams import run_available_now, source_stream
from tests.spark.wrapped import WrappedSink


def die() -> None:
    sys.stdout.flush()
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _is_crash_child(pid: int) -> bool:
    try:
        return b"tests.spark.crash_child" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class FlakySink(WrappedSink):
    """A sink whose task dies after preparing (see the module docstring); otherwise the
    wrapped sink, unchanged."""

    def __init__(self, inner: SinkConnector, plan: dict[str, Any], last: bool) -> None:
        super().__init__(inner, plan)
        self._last = last

    def pre_commit(self, epoch: int) -> CommitHandle:
        handle = self._inner.pre_commit(epoch)
        if not self._last:
            return handle
        if self._plan.get("kill") == "task:after-prepare" and epoch == self._plan["kill_epoch"]:
            # (a task's stdout does not reach the child's log: leave a mark for the test)
            (Path(self._plan["flags"]) / f"task-killed-{epoch}").touch()
            # PySpark's worker daemon has a process group of its own: kill the driver's
            # group (Python driver, JVM) first, then this one.
            driver = int(self._plan["driver_pgid"])
            if _is_crash_child(driver):  # never a reused pid: it could be anyone's
                os.killpg(driver, signal.SIGKILL)
            die()
        if epoch % 2 == 0 and self._part.startswith("p0-"):
            flag = Path(self._plan["flags"]) / f"failed-{epoch}"
            try:
                flag.touch(exist_ok=False)
            except FileExistsError:
                return handle
            os._exit(3)  # the task's Python worker dies: Spark retries the task
        return handle


@dataclass(frozen=True)
class FlakySpec(SinkSpec):
    """A sink spec whose sinks are FlakySinks; pickled with its plan to the executors."""

    plan: str = "{}"
    last: bool = False

    def build(self) -> SinkConnector:
        return FlakySink(super().build(), json.loads(self.plan), self.last)


class CrashingWriter(DurableBatchWriter):
    """The product's writer, with a SIGKILL at the plan's moment."""

    def __init__(self, plan: dict[str, Any], *args: Any) -> None:
        self.plan = plan
        self.epoch: int | None = None
        super().__init__(*args)

    def _on_step(self, step: str) -> None:
        if self.plan.get("trace"):
            print(f"step {step} of epoch {self.epoch}", flush=True)
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
    executor = plan.get("mode") == "executor"
    testbed = Testbed.create()
    conf: dict[str, str] = {"spark.master": "local[2,3]"} if executor else {}
    if plan.get("target") == "cluster":  # executors on the test bed's standalone cluster
        conf = testbed.spark_cluster.driver_conf()
        os.environ.update(testbed.spark_cluster.driver_env())
    spark = testbed.spark.session("durable-sinks-crash-child", **conf)
    spark.sparkContext.setLogLevel("ERROR")
    sinks: list[SinkSpec]
    options: dict[str, Any] = {}
    if plan.get("bad_rows"):
        target = {"dsn": plan["dsn"], "table": plan["table"]}
        if executor:
            text = json.dumps({**plan, "driver_pgid": os.getpgid(0)})
            sinks = [FlakySpec("postgres", target, plan=text, last=True)]
        else:
            sinks = [sink("postgres", **target)]
        options = {
            "on_bad_rows": "dead_letter",
            "dead_letter": sink(
                "postgres", dsn=plan["dsn"], table=plan["dead_letter_table"], name="dead_letters"
            ),
            # every row of a part may be bad (executor mode holds each part to the cap)
            "max_bad_rows": 1.0,
        }
    elif plan.get("mode") == "kafka-alone":
        sinks = [
            sink(
                "kafka",
                bootstrap_servers=plan["bootstrap_servers"],
                topic=plan["topic"],
                request_timeout_s=20,
            )
        ]
    elif plan.get("mode") == "kafka-routed":
        sinks = [
            sink(
                "kafka",
                bootstrap_servers=plan["bootstrap_servers"],
                topics=plan["topics"],
                create_topic=True,  # the last topic does not exist until a row names it
                progress_topic=plan["progress_topic"],
                request_timeout_s=20,
            )
        ]
        if plan.get("dead_letter_topic"):  # on the same cluster: in the same transaction
            options = {
                "on_bad_rows": "dead_letter",
                "dead_letter": sink(
                    "kafka",
                    bootstrap_servers=plan["bootstrap_servers"],
                    topic=plan["dead_letter_topic"],
                    name="dead_letters",
                    request_timeout_s=20,
                ),
                "max_bad_rows": 1.0,
            }
    elif plan.get("mode") == "two-kafka":
        sinks = [
            sink("postgres", dsn=plan["dsn"], table=plan["table"], create_table=True),
            sink(
                "kafka",
                bootstrap_servers=plan["bootstrap_servers"],
                topic=plan["topic"],
                request_timeout_s=20,
            ),
            sink(
                "kafka",
                bootstrap_servers=plan["bootstrap_servers"],
                topic=plan["audit_topic"],
                name="audit",
                request_timeout_s=20,
            ),
        ]
    elif plan.get("mode") == "delta-alone":
        sinks = [sink("delta", path=plan["delta"], create_table=True)]
    elif executor:
        text = json.dumps({**plan, "driver_pgid": os.getpgid(0)})
        pg = {"dsn": plan["dsn"], "table": plan["table"], "create_table": True}
        sinks = [
            FlakySpec("postgres", pg, plan=text),
            FlakySpec("s3", plan["s3"], plan=text),
            FlakySpec("delta", {"path": plan["delta"], "create_table": True}, plan=text),
            FlakySpec("iceberg", plan["iceberg"], plan=text),
            FlakySpec("files", {"path": plan["files"]}, plan=text, last=True),
        ]
    else:
        sinks = [
            sink("postgres", dsn=plan["dsn"], table=plan["table"], create_table=True),
            sink("s3", **plan["s3"]),
            sink("delta", path=plan["delta"], create_table=True),
            sink("iceberg", **plan["iceberg"]),
            sink(
                "kafka",
                bootstrap_servers=plan["bootstrap_servers"],
                topic=plan["topic"],
                request_timeout_s=20,
            ),
        ]
    mode: Execution = "executor" if executor else "driver"
    writer = CrashingWriter(plan, sinks, JobOptions(plan["job_id"], execution=mode, **options))
    print("started", flush=True)
    if plan.get("bad_rows"):
        stream = bad_rows.source_stream(spark, Path(plan["source"]))
    else:
        stream = source_stream(spark, Path(plan["source"]))
    if executor:
        stream = stream.repartition(3)
    if plan.get("mode") == "kafka-routed":  # row n goes to topic n % 3
        names = ", ".join(f"'{t}'" for t in plan["topics"])
        routed = f"element_at(array({names}), CAST(id % 3 AS INT) + 1)"
        if plan.get("dead_letter_topic"):  # every 7th row names a topic outside the bounds
            routed = f"IF(id % 7 = 6, 'nowhere', {routed})"
        stream = stream.selectExpr("to_json(struct(id, body)) AS value", f"{routed} AS topic")
    run_available_now(stream, writer, Path(plan["checkpoint"]), 600)
    writer.close()
    spark.stop()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
