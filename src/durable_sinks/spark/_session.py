"""What a micro-batch tells about where it runs: classic PySpark or Spark Connect, and its query.

Classic PySpark runs `foreachBatch` in the driver's own Python, on the thread that runs the
batch: Spark's local properties there name the query and the batch. Under Spark Connect the
function runs in a Python process the Connect server starts (one per query), with a Connect
DataFrame: no JVM, no SparkContext, no local properties. There the query is found through the
public API: the batch's session is the client's session, and the one streaming query active in
it is the one running the batch.
"""

from __future__ import annotations

from typing import Any

#: Spark sets these on the thread that runs a streaming query's batch (classic PySpark).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"

_CONNECT_MODULE = "pyspark.sql.connect."


def is_connect(obj: Any) -> bool:
    """True for a Spark Connect DataFrame or SparkSession (checked by class, so that no module
    of Spark Connect, which needs the `connect` extra's gRPC libraries, is imported)."""
    return type(obj).__module__.startswith(_CONNECT_MODULE)


def batch_properties(df: Any) -> tuple[str | None, str | None]:
    """(query id, running batch id) of the query running `df`'s batch, each None when unknown.

    Classic: Spark's local properties of this thread. Connect: the query id of the only
    streaming query active in the batch's session (None when several are: the caller cannot
    tell which one runs it); the batch id is not known there."""
    session = df.sparkSession
    if is_connect(session):
        active = session.streams.active
        return (str(active[0].id) if len(active) == 1 else None), None
    context = session.sparkContext
    query = context.getLocalProperty(QUERY_ID_PROPERTY)
    batch = context.getLocalProperty(BATCH_ID_PROPERTY)
    return (None if query is None else str(query)), (None if batch is None else str(batch))
