"""Driver mode's reading of a micro-batch: persisted once, streamed as Arrow in bounded chunks.

The batch DataFrame is persisted (MEMORY_AND_DISK), its rows are counted per partition (the
job that fills the cache), and whole partitions are then collected with `toArrow()` in
chunks of at most `max_rows` rows (a larger partition alone). Spark never recomputes the batch
while it is written, and the driver never holds more than one chunk. Each chunk's row count is
compared with the count taken when the cache was filled: a difference means Spark recomputed
lost partitions and the query is not deterministic; BatchChangedError is raised before
anything can commit.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Any

from sinks.errors import BatchChangedError

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


def arrow_batches(
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
