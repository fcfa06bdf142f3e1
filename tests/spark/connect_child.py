"""A Spark Connect client in its own process, as a user's job script would be.

    python -m tests.spark.connect_child PLAN.json

It opens a remote session (`SparkSession.builder.remote(plan["url"])`), reads the JSON files of
`source` (`files_per_batch` per batch) and writes them with
`foreachBatch(durable_sink([...], job_id=..., ...))` (or `format("durable")` with
`"via": "format"`), trigger availableNow, checkpoint `checkpoint`; the function runs on the
Connect server. It prints one JSON line, `{"error": ..., "query_id": ...}` (the query's error or
null, its id), and exits 0 when the query finished, 1 when it failed.

Plan keys: url, source, checkpoint, job_id, sinks (a list of {"kind": ..., options}), job
(job options, e.g. execution, guarantee, outage_tolerance_s), repartition (int, optional),
pause (optional: {"epoch": n, "step": prefix, "flag": path}: on the server, the writer creates
`flag` after that coordinator step of that epoch and then sleeps, for the test to SIGKILL the
server there), version (optional: the client's version the writer claims when pickled),
companion (optional, true: another streaming query runs in the same session meanwhile).

Own process: a remote session changes process-wide state of pyspark (SPARK_CONNECT_MODE_ENABLED,
the active session), which must not leak into tests that use a classic session.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from durable_sinks.core.durable_fs import replace_atomically
from durable_sinks.spark import DurableBatchWriter, JobOptions, SinkSpec, register_data_source
from durable_sinks.spark._shipping import shipped
from tests.spark.streams import source_stream
from tests.support.connect_client import exit_without_release, short_retries


class PausingWriter(DurableBatchWriter):
    """The product's writer that, on the server, stops at the plan's moment (flag, sleep) and
    may claim another client version when pickled. Pickled by value (it lives in __main__)."""

    def __init__(self, plan: dict[str, Any], *args: Any) -> None:
        self.plan = plan
        self.epoch = -1
        super().__init__(*args)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "plan": self.plan}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.plan = state.pop("plan")
        self.epoch = -1
        super().__setstate__(state)

    def __reduce__(self) -> tuple[Any, ...]:
        version = self.plan.get("version")
        return shipped(self, version, self.options.job_id) if version else super().__reduce__()

    def __call__(self, df: Any, batch_id: int) -> None:
        self.epoch = int(batch_id)
        super().__call__(df, batch_id)

    def _on_step(self, step: str) -> None:
        pause = self.plan.get("pause")
        if pause and self.epoch == pause["epoch"] and step.startswith(pause["step"]):
            # Whole or not at all: the test reads the flag as soon as its name appears.
            replace_atomically(Path(pause["flag"]), step.encode())
            time.sleep(3600)  # until the test kills the server


def main(plan_path: str) -> int:
    from pyspark.sql import SparkSession

    plan = json.loads(Path(plan_path).read_text())
    spark = SparkSession.builder.remote(plan["url"]).getOrCreate()
    # A client retries a server that does not answer for ~10 minutes by default: give up
    # soon once the server (the driver) is killed.
    short_retries(spark)
    stream = source_stream(spark, Path(plan["source"]), plan.get("files_per_batch", 1))
    if plan.get("repartition"):
        stream = stream.repartition(int(plan["repartition"]))
    writer_stream = stream.writeStream.option("checkpointLocation", plan["checkpoint"])
    if plan.get("via") == "format":
        register_data_source(spark)
        options = {**plan["job"], "job_id": plan["job_id"], "sinks": json.dumps(plan["sinks"])}
        writer_stream = writer_stream.format("durable").options(**options)
    else:
        specs = [
            SinkSpec(s["kind"], {k: v for k, v in s.items() if k != "kind"}) for s in plan["sinks"]
        ]
        job, rest = JobOptions.split({**plan["job"], "job_id": plan["job_id"]})
        assert not rest, rest
        writer_stream = writer_stream.foreachBatch(PausingWriter(plan, specs, job))
    companion = None
    if plan.get("companion"):
        # Another query of the same session, running while the job's does: the session
        # then has two active queries.
        companion = spark.readStream.format("rate").load().writeStream.format("noop").start()
    query = writer_stream.trigger(availableNow=True).start()
    error: str | None = None
    try:
        query.awaitTermination(plan.get("timeout", 300))
    except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
        error = f"{type(exc).__name__}: {exc}"
    if error is None and query.isActive:
        query.stop()
        error = "timeout: the query did not finish"
    if companion is not None:
        companion.stop()
    print(json.dumps({"error": error, "query_id": str(query.id)}), flush=True)
    if error is not None:
        exit_without_release(1)  # the server may be gone: do not wait on it at exit
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
