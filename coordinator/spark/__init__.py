"""Spark Structured Streaming entry points (the only part of durable-sinks that knows Spark).

    from coordinator.spark import durable_sink, sink

    df.writeStream.foreachBatch(
        durable_sink("postgres", dsn=..., table="events", job_id="orders")
    ).option("checkpointLocation", "...").start()

Or as a data source: `register_data_source(spark)`, then `df.writeStream.format("durable")`.
See docs/guide.md for every option, the guarantees and their conditions.
"""

from ._arrow import plan_chunks
from ._datasource import DurableDataSource, register_data_source
from ._options import JobOptions
from ._specs import SinkSpec, sink
from ._writer import DurableBatchWriter, durable_sink

__all__ = [
    "DurableBatchWriter",
    "DurableDataSource",
    "JobOptions",
    "SinkSpec",
    "durable_sink",
    "plan_chunks",
    "register_data_source",
    "sink",
]
