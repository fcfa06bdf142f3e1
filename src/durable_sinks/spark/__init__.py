"""Spark Structured Streaming entry points: the only layer of durable-sinks that knows Spark.

    from durable_sinks import durable_sink, sink

    df.writeStream.foreachBatch(
        durable_sink("postgres", dsn=..., table="events", job_id="orders")
    ).option("checkpointLocation", "...").start()

Or as a data source: `register_data_source(spark)`, then `df.writeStream.format("durable")`.
Importing this package loads no Spark module and no database or Kafka client: Spark is
imported where a batch is read or a job is checked, a client where a sink of its kind is
built. See docs/guide.md for every option, the guarantees and their conditions.
"""

from ._options import JobOptions
from ._progress import BatchProgress, progress_listener
from ._registration import register_data_source
from ._specs import SinkSpec, sink
from ._writer import DurableBatchWriter, durable_sink

__all__ = [
    "BatchProgress",
    "DurableBatchWriter",
    "JobOptions",
    "SinkSpec",
    "durable_sink",
    "progress_listener",
    "register_data_source",
    "sink",
]
