"""Spark Structured Streaming entry points (the only part of durable-sinks that knows Spark).

    from coordinator.spark import durable_sink, sink

    df.writeStream.foreachBatch(
        durable_sink("postgres", dsn=..., table="events", job_id="orders")
    ).option("checkpointLocation", "...").start()

See docs/guide.md for every option, the guarantees and their conditions.
"""

from ._arrow import plan_chunks
from ._options import JobOptions
from ._specs import SinkSpec, sink
from ._writer import DurableBatchWriter, durable_sink

__all__ = ["DurableBatchWriter", "JobOptions", "SinkSpec", "durable_sink", "plan_chunks", "sink"]
