"""Executor mode: every partition of a micro-batch is written and prepared by its own task.

`mapInArrow` runs `prepare_part` in each task, on the partition's Arrow batches, with a part
name unique per task attempt (`p<partition>-t<task attempt id>`): a retried or speculative
attempt is another participant. Each task returns its handles as JSON rows; Spark hands the
driver the output of exactly one successful attempt per partition, and those are the handles
the coordinator decides. Attempts whose output Spark dropped stay prepared until the
coordinator rolls them back (DistributedSink.prepared_participants). Nothing of the batch
passes through the driver's memory but the handles. The sinks' task briefs of the epoch
(Coordinator.task_briefs: facts of the targets the driver read, no secrets) travel in the
function's closure to every task. The Python Data Source path (_datasource.py) has none: its
writer is shipped once per query, so its tasks find what they need themselves.

A task whose part fails with one of our errors (a DurableSinkError: bad data, a server
restarting ...) rolls its part back and returns the error itself, pickled, instead of failing:
the driver raises it typed as it is (so a retriable one is ridden out, see _writer.py), rather
than as Spark's generic task failure, and Spark does not spend its task retries on an outage
the driver handles. Any other exception fails the task as usual.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from durable_sinks.coordinator import prepare_part
from durable_sinks.core import CommitHandle, SinkConnector
from durable_sinks.core.errors import DurableSinkError

from ._options import JobOptions
from ._specs import SinkSpec

if TYPE_CHECKING:
    import pyarrow as pa

HANDLE_COLUMN = "handle"
ERROR_COLUMN = "error"


def prepare_on_executors(
    df: Any,
    specs: Sequence[SinkSpec],
    options: JobOptions,
    generation: int,
    epoch: int,
    briefs: Mapping[str, bytes] | None = None,
) -> list[CommitHandle]:
    """Run one Spark job that prepares every partition of `df` as part of `epoch` (with the
    part's dead letters, when the job has a dead-letter sink); return the handles of the
    attempts Spark kept. `briefs` (the sinks' task briefs of the epoch, by sink name:
    Coordinator.task_briefs) travel with the job's function to every task."""
    job_id = options.job_id
    build = sink_builder(specs, options)
    policy, cap = options.write_policy, options.bad_row_cap
    dead_letter = None if options.dead_letter is None else options.dead_letter.name
    given = dict(briefs or {})

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        task = TaskContext.get()
        part = "p0-t0" if task is None else f"p{task.partitionId()}-t{task.taskAttemptId()}"
        try:
            handles = prepare_part(
                job_id,
                generation,
                epoch,
                part,
                build,
                batches,
                policy=policy,
                dead_letter=dead_letter,
                bad_row_cap=cap,
                briefs=given,
            )
        except DurableSinkError as exc:  # rolled back by prepare_part; raised on the driver
            failed = pa.array([pickle.dumps(exc)], pa.binary())
            yield pa.record_batch([pa.nulls(1, pa.string()), failed], names=COLUMNS)
            return
        column = pa.array([h.dumps() for h in handles], pa.string())
        yield pa.record_batch([column, pa.nulls(len(handles), pa.binary())], names=COLUMNS)

    rows = df.mapInArrow(write, f"{HANDLE_COLUMN} string, {ERROR_COLUMN} binary").collect()
    for row in rows:
        if row[ERROR_COLUMN] is not None:
            raise _task_error(bytes(row[ERROR_COLUMN]))
    return [CommitHandle.from_json(json.loads(row[HANDLE_COLUMN])) for row in rows]


COLUMNS = [HANDLE_COLUMN, ERROR_COLUMN]


def sink_builder(
    specs: Sequence[SinkSpec], options: JobOptions
) -> Callable[[], list[SinkConnector]]:
    """What a task calls to build the job's sinks: the targets, then the dead-letter sink."""
    every = [*specs, *([options.dead_letter] if options.dead_letter is not None else [])]

    def build() -> list[SinkConnector]:
        return [spec.build() for spec in every]

    return build


def _task_error(pickled: bytes) -> DurableSinkError:
    """The error a task returned (our own class, pickled by the same version of the package:
    the workers were checked to import it at start)."""
    error = pickle.loads(pickled)  # noqa: S301 - written by this job's own tasks
    if not isinstance(error, DurableSinkError):  # pragma: no cover - only ours are sent
        raise TypeError(f"a task returned {type(error).__name__}, not a DurableSinkError")
    return error
