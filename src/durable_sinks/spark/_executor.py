"""Executor mode: every partition of a micro-batch is written and prepared by its own task.

`mapInArrow` runs `prepare_part` in each task, on the partition's Arrow batches, with a part
name unique per task attempt (`p<partition>-t<task attempt id>`): a retried or speculative
attempt is another participant. Each task returns its handles as JSON rows; Spark hands the
driver the output of exactly one successful attempt per partition, and those are the handles
the coordinator decides. Attempts whose output Spark dropped stay prepared until the
coordinator rolls them back (DistributedSink.prepared_participants). Nothing of the batch
passes through the driver's memory but the handles.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from durable_sinks.coordinator import prepare_part
from durable_sinks.core import CommitHandle, SinkConnector

from ._specs import SinkSpec

if TYPE_CHECKING:
    import pyarrow as pa

HANDLE_COLUMN = "handle"


def prepare_on_executors(
    df: Any, specs: Sequence[SinkSpec], job_id: str, generation: int, epoch: int
) -> list[CommitHandle]:
    """Run one Spark job that prepares every partition of `df` as part of `epoch`; return
    the handles of the attempts Spark kept."""

    def build() -> list[SinkConnector]:
        return [spec.build() for spec in specs]

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        task = TaskContext.get()
        part = "p0-t0" if task is None else f"p{task.partitionId()}-t{task.taskAttemptId()}"
        handles = prepare_part(job_id, generation, epoch, part, build, batches)
        column = pa.array([h.dumps() for h in handles], pa.string())
        yield pa.record_batch([column], names=[HANDLE_COLUMN])

    rows = df.mapInArrow(write, f"{HANDLE_COLUMN} string").collect()
    return [CommitHandle.from_json(json.loads(row[HANDLE_COLUMN])) for row in rows]
