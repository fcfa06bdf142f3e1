"""The soak's streaming job: one Spark driver process, its executors on the test bed's Spark
standalone cluster, writing Postgres, Kafka and S3 exactly once through `durable_sink`.

    python -m tests.soak.driver PLAN.json

The source is the folder of JSON files the soak keeps adding to (`source`); the query runs with
a processing-time trigger until the process is killed or the query fails (exit 1: the soak
starts the job again from its checkpoint). With `"drain": true` it processes every file not yet
processed (availableNow) and exits 0: the soak's last run, after the faults.

Plan keys: conf (Spark conf: the cluster's `driver_conf()`), dsn, table, bootstrap_servers,
topic, s3 (the S3 sink's options), job_id, source, checkpoint, mode ("driver": Postgres +
Kafka + S3; "executor": Postgres + S3 + files under `files`), trigger_s, files_per_batch,
drain, batches (the log every finished batch is appended to: tests/soak/pauses.py). On the
faults bed Postgres and Kafka are reached through Toxiproxy (the soak cuts those links); on
the replicated servers by a multi-host conninfo and all three brokers.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from durable_sinks.spark import durable_sink, sink
from tests.services import Testbed
from tests.soak.pauses import BatchLog
from tests.spark.streams import run_available_now, source_stream


def sinks_of(plan: dict[str, Any]) -> list[Any]:
    made = [
        sink("postgres", dsn=plan["dsn"], table=plan["table"], create_table=True),
        sink("s3", **plan["s3"]),
    ]
    if plan["mode"] == "executor":
        made.append(sink("files", path=plan["files"]))
    else:
        made.append(sink("kafka", bootstrap_servers=plan["bootstrap_servers"], topic=plan["topic"]))
    return made


def main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    os.environ.update(plan["env"])  # PYSPARK_PYTHON for the executors' Python workers
    spark = Testbed.create().spark.session("durable-sinks-soak", **plan["conf"])
    spark.sparkContext.setLogLevel("ERROR")
    writer = durable_sink(sinks_of(plan), job_id=plan["job_id"], execution=plan["mode"])
    print(f"started; recovery: {writer.recovery}", flush=True)
    write = BatchLog(Path(plan["batches"])).wrap(writer)
    stream = source_stream(spark, Path(plan["source"]), plan.get("files_per_batch", 4))
    if plan.get("drain"):
        run_available_now(stream, write, Path(plan["checkpoint"]), 900)
        print("drained", flush=True)
        writer.close()
        spark.stop()
        return 0
    query = (
        stream.writeStream.foreachBatch(write)
        .option("checkpointLocation", plan["checkpoint"])
        .trigger(processingTime=f"{plan.get('trigger_s', 2)} seconds")
        .start()
    )
    while query.isActive:  # until the soak kills this process, or the query fails
        time.sleep(1)
        progress = query.lastProgress
        if progress is not None and progress.get("numInputRows"):
            print(f"batch {progress['batchId']}: {progress['numInputRows']} rows", flush=True)
    error = query.exception()
    print(f"the query stopped: {error}", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
