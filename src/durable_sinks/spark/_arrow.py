"""Driver mode's two ways of reading a micro-batch as Arrow record batches.

`streamed_batches` (the default): one Spark job computes the batch once, its executors turn
each partition into Arrow record batches (`spark.sql.execution.arrow.maxRecordsPerBatch`
rows each), and the driver's Python receives them as the partitions finish, one record batch
at a time. What the driver's JVM holds meanwhile (finished partitions not read yet) is bounded
by `spark.driver.maxResultSize`: a larger batch fails the job with ResultTooLargeError
before anything is decided. It uses PySpark's private collect-as-Arrow socket (the one
`toArrow()` uses), which is why `pyspark` is pinned to one version.

`chunked_batches`: the batch DataFrame is persisted (MEMORY_AND_DISK), its rows are counted per
partition (the job that fills the cache), and whole partitions are then collected with
`toArrow()` in chunks of at most `max_rows` rows (a larger partition alone). Spark never
recomputes the batch while it is written, and the driver never holds more than one chunk, so
any batch size works, at the price of the cache. Each chunk's row count is compared with the
count taken when the cache was filled: a difference means Spark recomputed lost partitions and
the query is not deterministic; BatchChangedError is raised before anything can commit.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Any

from durable_sinks.core.errors import BatchChangedError
from durable_sinks.core.joblog import JobLogger

if TYPE_CHECKING:
    import pyarrow as pa


def plan_chunks(counts: Mapping[int, int], max_rows: int) -> list[list[int]]:
    """Group partition ids (ascending) into consecutive chunks of at most `max_rows` rows; a
    partition with more rows than that forms a chunk of its own. Empty partitions are left
    out."""
    if max_rows < 1:
        raise ValueError("max_rows must be >= 1")
    chunks: list[list[int]] = []
    current: list[int] = []
    held = 0
    for partition in sorted(counts):
        rows = counts[partition]
        if rows <= 0:
            continue
        if current and held + rows > max_rows:
            chunks.append(current)
            current, held = [], 0
        current.append(partition)
        held += rows
    if current:
        chunks.append(current)
    return chunks


class ResultTooLargeError(Exception):
    """The batch did not fit `spark.driver.maxResultSize` when streamed (the job failed); the
    message is Spark's line that says so."""


def is_result_too_large(exc: BaseException) -> bool:
    """True when `exc` is Spark's "total size of serialized results ... is bigger than
    spark.driver.maxResultSize" job failure, however PySpark wrapped it."""
    return "maxResultSize" in str(exc)


def _too_large(exc: BaseException) -> ResultTooLargeError:
    lines = [line.strip() for line in str(exc).splitlines() if "maxResultSize" in line]
    return ResultTooLargeError(lines[0] if lines else str(exc))


def streamed_batches(
    df: Any, *, job: str, epoch: int | None = None
) -> Generator[pa.RecordBatch, None, None]:
    """The rows of `df` as described in the module docstring, in the order its partitions
    finish, each record batch cast to the schema `df.toArrow()` would give. Raises
    ResultTooLargeError (chained to Spark's error) when the batch exceeds
    `spark.driver.maxResultSize`; closing the iterator early ends the job's stream."""
    import pyarrow as pa
    from pyspark.errors.exceptions.captured import unwrap_spark_exception
    from pyspark.sql.pandas.serializers import ArrowCollectSerializer
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.util import _load_from_socket

    conf = df.sparkSession.conf
    large = str(conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false")) == "true"
    schema = to_arrow_schema(
        df.schema,
        error_on_duplicated_field_names_in_struct=True,
        timezone="UTC",
        prefers_large_types=large,
    )
    port, secret, server = df._jdf.collectAsArrowToPython()
    finished = False
    try:
        serializer = ArrowCollectSerializer()  # type: ignore[no-untyped-call]
        with _load_from_socket((port, secret), serializer) as stream:
            for item in stream:
                if isinstance(item, pa.RecordBatch):  # (the last item: the batches' order)
                    yield item if item.schema == schema else item.cast(schema)
        finished = True
    except Exception as exc:
        if is_result_too_large(exc):
            raise _too_large(exc) from exc
        raise
    finally:
        try:
            with unwrap_spark_exception():
                server.getResult()  # joins the serving thread; raises the job's error
        except Exception as exc:
            if not finished:  # an error is on its way out already; this one follows from it
                log = JobLogger(job, epoch=epoch, component="spark")
                log.debug("the collect job ended with: %s", exc)
            elif is_result_too_large(exc):
                raise _too_large(exc) from exc
            else:
                raise


def chunked_batches(
    df: Any, max_rows: int, *, job: str | None = None, epoch: int | None = None
) -> Generator[pa.RecordBatch, None, None]:
    """The rows of `df` as record batches, read as described in the module docstring. Persists
    `df` only once iterated; unpersists it when the iterator ends or is closed."""
    from pyspark import StorageLevel
    from pyspark.sql.functions import spark_partition_id

    df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        partition = spark_partition_id()
        counts = {
            int(row[0]): int(row[1]) for row in df.groupBy(partition.alias("p")).count().collect()
        }
        chunks = plan_chunks(counts, max_rows)
        for chunk in chunks:
            expected = sum(counts[p] for p in chunk)
            part = df if len(chunks) == 1 else df.where(partition.isin(chunk))
            table = part.toArrow()
            if table.num_rows != expected:
                raise BatchChangedError(
                    f"partitions {chunk[0]}..{chunk[-1]} of the batch gave {table.num_rows} "
                    f"rows, {expected} when first read: Spark recomputed them and the query is "
                    "not deterministic",
                    job=job,
                    epoch=epoch,
                    fix="make the query deterministic (no rand(), uuid(), current_timestamp() or "
                    "unordered limits before the sink), or give the driver and executors "
                    "enough memory/disk that cached batches are not lost",
                )
            yield from table.to_batches()
            del table
    finally:
        df.unpersist()
