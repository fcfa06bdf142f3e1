"""Executor mode's worker side: one part of an epoch, written and prepared where the data is.

The driver's coordinator (generation g) asks workers to prepare parts of an epoch; each worker
builds fresh sinks, opens them as workers of generation g (no fencing side effects), writes its
part into every sink and prepares it. The handles go back to the driver, which decides and
commits (Coordinator.run_distributed_epoch). A worker never commits anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from durable_sinks.core import CommitHandle, OpenContext, SinkConnector
from durable_sinks.core.bad_rows import BadRowCap, WritePolicy
from durable_sinks.core.joblog import JobLogger

from ._dead_letters import DeadLetterPass, write_dead_letters

if TYPE_CHECKING:
    import pyarrow as pa


def prepare_part(
    job_id: str,
    generation: int,
    epoch: int,
    part: str,
    build_sinks: Callable[[], Sequence[SinkConnector]],
    batches: Iterable[pa.RecordBatch],
    *,
    policy: WritePolicy | None = None,
    dead_letter: str | None = None,
    bad_row_cap: BadRowCap | None = None,
    briefs: Mapping[str, bytes] | None = None,
) -> list[CommitHandle]:
    """Write `batches` as part `part` of `epoch` into every sink `build_sinks()` makes, and
    prepare it: one handle per sink, durable and invisible when this returns. An empty part
    prepares nothing (returns []). On any error, what this call began is rolled back and the
    error is raised: nothing of the part stays prepared.

    `part` must be unique per attempt and read `<slice>-<attempt>` (e.g. `p3-t17`: partition
    and task attempt ids): two attempts of one partition are two participants of one slice,
    and the driver's decision picks one (`ParticipantName.slice`).

    With `policy` routing bad rows to the dead-letter sink named `dead_letter` (one of the
    sinks built), the rows the other sinks refuse become the part's dead letters, prepared
    as one more participant of the part (only when there are some); `bad_row_cap` holds per
    part.

    `briefs` are the driver's task briefs of `epoch` by sink name (Coordinator.task_briefs):
    each sink gets its own in `OpenContext.task_brief`; a sink without one finds what it
    needs itself."""
    log = JobLogger(job_id, epoch=epoch, component="worker")
    iterator = iter(batches)
    first = next(iterator, None)
    if first is None:
        return []
    policy = policy if policy is not None else WritePolicy()
    briefs = briefs if briefs is not None else {}
    built = list(build_sinks())
    letters_sink = next((s for s in built if s.name == dead_letter), None)
    sinks = [s for s in built if s is not letters_sink]
    letters = DeadLetterPass(
        job_id,
        epoch,
        bad_row_cap if bad_row_cap is not None else BadRowCap(),
        isolating=letters_sink is not None,
        part=part,
    )
    begun: list[SinkConnector] = []
    handles: dict[str, CommitHandle] = {}
    try:
        for sink in sinks:
            sink.open(
                OpenContext(
                    job_id,
                    sink.name,
                    generation,
                    worker=True,
                    part=part,
                    policy=policy,
                    task_brief=briefs.get(sink.name),
                )
            )
            sink.begin_epoch(epoch)
            begun.append(sink)
        batch: pa.RecordBatch | None = first
        index = 0
        while batch is not None:
            letters.read(index, batch)
            for sink in sinks:
                letters.add(sink.name, index, batch, sink.write_batch(batch).refused)
            batch = next(iterator, None)
            index += 1
        letters.check_cap()
        dead = letters.batch()
        if dead is not None and letters_sink is not None:
            letters_sink.open(
                OpenContext(
                    job_id,
                    letters_sink.name,
                    generation,
                    worker=True,
                    part=part,
                    task_brief=briefs.get(letters_sink.name),
                )
            )
            letters_sink.begin_epoch(epoch)
            begun.append(letters_sink)
            write_dead_letters(letters_sink, dead, job_id, epoch)
            sinks.append(letters_sink)
        for sink in sinks:
            handles[sink.name] = sink.pre_commit(epoch)
    except BaseException as exc:
        log.warning("part %s failed before it was prepared (%s): rolling back", part, exc)
        for sink in begun:
            try:
                sink.rollback_epoch(epoch, handles.get(sink.name))
            except Exception as undo:  # noqa: BLE001 - the original error matters more
                log.bind(sink=sink.name).warning(
                    "rollback of part %s failed (%s); the driver rolls back leftovers", part, undo
                )
        raise
    finally:
        for sink in built:
            _close_quietly(sink, log)
    log.debug("part %s prepared: %s", part, [h.participant for h in handles.values()])
    return [handles[s.name] for s in sinks]


def _close_quietly(sink: SinkConnector, log: JobLogger) -> None:
    try:
        sink.close()
    except Exception as exc:  # noqa: BLE001 - a prepared participant outlives its session
        log.bind(sink=sink.name).debug("closing failed: %s", exc)
