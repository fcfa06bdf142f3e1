"""A query whose batches exceed `spark.driver.maxResultSize`, in a Spark of its own (the
setting is fixed when the SparkContext starts): `python -m tests.spark.result_size_child
PLAN.json`. Driver mode streams the first batch, Spark fails that read, and the writer
reads the batch again partition by partition, and every later batch too. Prints
`read: <mode>` at the end."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from durable_sinks.spark import durable_sink
from tests.services import Testbed
from tests.spark.streams import run_available_now, source_stream

#: Small enough that a batch of a few thousand padded rows is over it.
MAX_RESULT_SIZE = "1m"


def main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s"
    )
    spark = Testbed.create().spark.session(
        "durable-sinks-result-size", **{"spark.driver.maxResultSize": MAX_RESULT_SIZE}
    )
    spark.sparkContext.setLogLevel("OFF")
    writer = durable_sink(
        "postgres",
        dsn=plan["dsn"],
        table=plan["table"],
        job_id=plan["job_id"],
        create_table=True,
        max_rows_in_memory=plan["max_rows_in_memory"],
    )
    padded = source_stream(spark, Path(plan["source"])).selectExpr(
        "id", f"repeat(body, {plan['repeat']}) AS body"
    )
    run_available_now(padded.repartition(4), writer, Path(plan["checkpoint"]))
    result = writer.last_result
    assert result is not None
    print(f"read: {writer._read}; last batch: {result.metrics.batches} record batches", flush=True)
    writer.close()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
