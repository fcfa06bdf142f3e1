"""What a micro-batch tells about where it runs: classic PySpark or Spark Connect, and its query.

Classic PySpark runs `foreachBatch` in the driver's own Python, on the thread that runs the
batch: Spark's local properties there name the query and the batch. Under Spark Connect the
function runs in a Python process the Connect server starts (one per query), with a Connect
DataFrame: no JVM, no SparkContext, no local properties. There the query is found through the
public API: the batch's session is the client's session, and the one streaming query active in
it is the one running the batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from durable_sinks.core.errors import ConfigError

#: The file of a streaming checkpoint that holds the query's id (`{"id": "<uuid>"}`), written
#: when the query starts from it the first time.
CHECKPOINT_METADATA = "metadata"

#: Spark sets these on the thread that runs a streaming query's batch (classic PySpark).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"

#: The local property whose value describes the jobs a thread starts (the "Description" of
#: Spark's UI, its REST API and its event log).
JOB_DESCRIPTION_PROPERTY = "spark.job.description"

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


def checkpoint_query_id(session: Any, location: str, *, job: str) -> str:
    """The id of the query whose checkpoint is at `location`, read through `session` (classic
    or Spark Connect: Spark reads the checkpoint's file system, whatever it is). ConfigError
    when there is no streaming checkpoint there."""
    path = location.rstrip("/") + "/" + CHECKPOINT_METADATA
    fix = (
        "give checkpoint_location the query's checkpointLocation, exactly as passed to "
        ".option('checkpointLocation', ...)"
    )
    try:
        lines = [row[0] for row in session.read.text(path).collect()]
    except Exception as exc:  # noqa: BLE001 - Spark's own errors (path not found, ...)
        raise ConfigError(
            f"checkpoint_location {location!r} holds no streaming checkpoint: reading "
            f"{path} failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
            job=job,
            fix=fix,
        ) from None
    try:
        query = json.loads(lines[0])["id"] if lines else None
    except (ValueError, TypeError, KeyError):
        query = None
    if not isinstance(query, str) or not query:
        raise ConfigError(
            f"{path} is not a streaming checkpoint's metadata (no query id in it)",
            job=job,
            fix=fix,
        )
    return query


@contextmanager
def described(df_or_session: Any, text: str) -> Iterator[None]:
    """The Spark jobs this thread starts in the block are described as `text` in Spark's UI;
    the thread's description is restored after. (Not followed by the description Spark gave
    the batch: the thread that runs foreachBatch inherited it when it was made, so it may
    name an older batch.) Classic PySpark only: under Spark Connect the function has no
    SparkContext (nothing is set)."""
    session = getattr(df_or_session, "sparkSession", df_or_session)
    if is_connect(session):
        yield
        return
    context = session.sparkContext
    before = context.getLocalProperty(JOB_DESCRIPTION_PROPERTY)
    context.setLocalProperty(JOB_DESCRIPTION_PROPERTY, text)
    try:
        yield
    finally:
        context.setLocalProperty(JOB_DESCRIPTION_PROPERTY, before)
