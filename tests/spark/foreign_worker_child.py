"""A Spark whose Python workers run an interpreter without durable-sinks, in a process of its
own (the workers' interpreter is fixed when the SparkContext starts): `python -m
tests.spark.foreign_worker_child PLAN.json`. It builds an executor-mode writer and prints, as
one JSON line, what `durable_sink` raised."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from durable_sinks import ConfigError, durable_sink, sink
from tests.services import Testbed


def main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    os.environ["PYSPARK_PYTHON"] = plan["worker_python"]  # read when the SparkContext starts
    spark = Testbed.create().spark.session("durable-sinks-foreign-worker")
    spark.sparkContext.setLogLevel("OFF")
    outcome: dict[str, str | None] = {"error": None, "message": None, "fix": None}
    try:
        writer = durable_sink(
            [sink("files", path=plan["output"])],
            job_id=plan["job_id"],
            decision_store=plan["store"],
            execution="executor",
        )
        writer.close()
    except ConfigError as exc:
        outcome = {"error": type(exc).__name__, "message": exc.message, "fix": exc.fix}
    print(json.dumps(outcome), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
