"""What the epoch procedures do to the job's sinks besides beginning and preparing: stream
the batches into them, commit a decided epoch's participants, undo an attempt, and roll back
the losing attempts of a distributed epoch. Each step yields its crash point's name."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import TYPE_CHECKING

from durable_sinks.core.errors import (
    CommitIncompleteError,
    CorruptRecordError,
    DurableSinkError,
    FencedError,
    ParticipantLostError,
    SchemaMismatchError,
    UsageError,
)
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import (
    ChecksParticipants,
    CommitHandle,
    ConcurrentCommitter,
    DistributedSink,
    PublishingSink,
    SinkConnector,
)
from durable_sinks.manifest import DecisionRecord

from ._dead_letters import DeadLetterPass
from ._fanout import FanOut, InTurn, Written
from ._metrics import EpochMetrics
from ._retry import RetryPolicy
from ._watch import Watch

if TYPE_CHECKING:
    import pyarrow as pa

Steps = Generator[str, None, None]


class Participants:
    """The job's sinks as the epoch procedures use them. Commits and rollbacks retry
    transient errors by `retry`."""

    def __init__(
        self,
        job_id: str,
        sinks: Sequence[SinkConnector],
        retry: RetryPolicy,
        concurrent_writes: bool = True,
        occasional: SinkConnector | None = None,
        watch: Watch | None = None,
    ) -> None:
        self.job_id = job_id
        #: Told each sink call while it runs (the epoch in flight).
        self.watch = watch
        self.sinks = sinks
        #: A sink that takes part only in some epochs (the dead-letter sink): an epoch whose
        #: decision names none of its participants is not published on it.
        self.occasional = occasional
        self.retry = retry
        self.concurrent_writes = concurrent_writes

    def write(
        self,
        epoch: int,
        sinks: Sequence[SinkConnector],
        batches: Iterable[pa.RecordBatch],
        metrics: EpochMetrics,
        letters: DeadLetterPass,
    ) -> Steps:
        """Stream every batch into every one of `sinks` (one pass over `batches`), the sinks
        writing concurrently and while the next batch is read (`_fanout`). Yields
        `after-write:<batch>:<sink>` as each write finishes, in the order of the batches and,
        per batch, of `sinks`. The "write" phase counts the time this thread waited for the
        writers (what reading did not hide); `metrics.sink_seconds` each sink's own. Without
        `concurrent_writes`: in this thread, one sink after the other."""
        writers = (
            FanOut(list(sinks), f"ds-{self.job_id}-{epoch}", self.watch)
            if self.concurrent_writes
            else InTurn(list(sinks), self.watch)
        )
        with writers:
            for index, batch in enumerate(batches):
                _require_record_batch(batch, self.job_id, epoch)
                metrics.batches += 1
                letters.read(index, batch)
                yield from self._written(writers.submit(index, batch), metrics, letters)
            yield from self._written(writers.drain(), metrics, letters)

    @staticmethod
    def _written(done: Iterator[Written], metrics: EpochMetrics, letters: DeadLetterPass) -> Steps:
        while True:
            with metrics.phase("write"):
                written = next(done, None)
            if written is None:
                return
            letters.add(written.sink.name, written.index, written.batch, written.result.refused)
            yield _counted(written, metrics)

    def commit(self, sink: SinkConnector, handles: Sequence[CommitHandle]) -> None:
        """Commit participants of one decided epoch of `sink` (idempotent), concurrently where
        the sink can (`ConcurrentCommitter`), retrying transient errors;
        CommitIncompleteError when it cannot be done now (replay or restart finishes it);
        FencedError as it is when a newer driver owns the job (its recovery finishes it);
        ParticipantLostError as it is when a participant is gone (not retriable: the
        epoch's rows are lost from the sink until an operator repairs them)."""
        if not handles:
            return
        epoch = handles[0].epoch
        for handle in handles:
            require_own(self.job_id, sink, handle, epoch)
        if len(handles) == 1:
            what = f"committing participant {handles[0].participant}"
        else:
            what = f"committing the epoch's {len(handles)} participants"
        if len(handles) > 1 and isinstance(sink, ConcurrentCommitter):
            self._settle(
                sink,
                epoch,
                what,
                "commit_participants",
                lambda: sink.commit_participants(epoch, handles),
            )
            return

        def commit_each() -> None:
            for handle in handles:
                sink.commit_epoch(epoch, handle)

        self._settle(sink, epoch, what, "commit_epoch", commit_each)

    def check(
        self, sinks: Sequence[SinkConnector], epoch: int, handles: Iterable[CommitHandle]
    ) -> None:
        """Before the decision: each sink that can (`ChecksParticipants`) checks that its
        handles of `epoch` could all land, raising what conflicts (the epoch is then rolled
        back, never decided)."""
        grouped = _by_sink(handles)
        for sink in sinks:
            if isinstance(sink, ChecksParticipants) and grouped.get(sink.name):
                with self.calling(sink, "check_participants"):
                    sink.check_participants(epoch, grouped[sink.name])

    def publish(self, sink: SinkConnector, decision: DecisionRecord) -> bool:
        """Publish a decided epoch on a PublishingSink (after its participants committed), as
        `commit` retries and fails; False for other sinks (nothing to do)."""
        if not isinstance(sink, PublishingSink):
            return False
        handles = decision.handles_for(sink.name)
        self._settle(
            sink,
            decision.epoch,
            "publishing the epoch",
            "publish_epoch",
            lambda: sink.publish_epoch(decision.epoch, handles),
        )
        return True

    def calling(self, sink: SinkConnector, call: str) -> AbstractContextManager[None]:
        """Told to the watch while the block runs: `sink` is in `call`."""
        return nullcontext() if self.watch is None else self.watch.calling(sink.name, call)

    def _settle(
        self, sink: SinkConnector, epoch: int, what: str, name: str, call: Callable[[], object]
    ) -> None:
        try:
            with self.calling(sink, name):
                self.retry.call(call)
        except FencedError:
            raise  # a newer driver owns the job (and its recovery finishes this commit)
        except ParticipantLostError:
            raise  # no retry, replay or restart brings it back: the repair is the operator's
        except DurableSinkError as exc:
            raise CommitIncompleteError(
                f"the epoch is decided but {what} failed: {exc}",
                job=self.job_id,
                sink=sink.name,
                epoch=epoch,
                fix="replaying the epoch or restarting the job finishes the commit",
            ) from exc

    def commit_decided(
        self,
        decision: DecisionRecord,
        metrics: EpochMetrics,
        skip: SinkConnector | None,
        finished: Callable[[], bool] = lambda: False,
    ) -> Steps:
        """Commit every participant `decision` names, except those of `skip` (the last
        resource, whose participant committed with the decision itself): the sinks one after
        the other, each sink's participants at once (`commit`), then publish the
        epoch on every PublishingSink (each of them, even one without a participant: an
        empty epoch is published too; but not on the `occasional` sink, which took no part
        in it). A participant of a sink the job no longer has is passed over when
        `finished()` says every participant of the epoch committed (asked only then); else
        CommitIncompleteError: only the job with that sink can finish the epoch."""
        by_name = {s.name: s for s in self.sinks}
        for name, handles in _by_sink(decision.handles).items():
            sink = by_name.get(name)
            if sink is None:
                if finished():
                    continue  # it committed with the epoch, before the sink left the job
                raise CommitIncompleteError(
                    f"the decision of epoch {decision.epoch} names sink {name!r}, which "
                    "this job no longer has, and the epoch is not finished: that sink's part "
                    "may still be prepared, not committed",
                    job=self.job_id,
                    epoch=decision.epoch,
                    fix=f"run the job once more with sink {name!r} (the same name and "
                    "options) so that the epoch finishes, then remove the sink",
                )
            if sink is skip:
                continue
            with metrics.phase("commit"):
                self.commit(sink, handles)
            yield f"after-commit:{sink.name}"
        for sink in self.sinks:
            if sink is skip or (sink is self.occasional and not decision.handles_for(sink.name)):
                continue
            with metrics.phase("commit"):
                published = self.publish(sink, decision)
            if published:
                yield f"after-commit:{sink.name}"

    def roll_back(self, sink: SinkConnector, epoch: int, handle: CommitHandle | None) -> None:
        """Roll back one participant, retrying transient errors."""
        if handle is not None:
            require_own(self.job_id, sink, handle, epoch)
        with self.calling(sink, "rollback_epoch"):
            self.retry.call(partial(sink.rollback_epoch, epoch, handle))

    def undo(
        self,
        epoch: int,
        begun: Sequence[SinkConnector],
        handles: dict[str, CommitHandle],
        log: JobLogger,
    ) -> None:
        """Undo every participant of a failed attempt. A failure here is logged, not raised:
        the original error matters more, and recovery rolls back whatever is left (presumed
        abort)."""
        for sink in begun:
            try:
                with self.calling(sink, "rollback_epoch"):
                    sink.rollback_epoch(epoch, handles.get(sink.name))
            except Exception as exc:  # noqa: BLE001 - see docstring
                log.bind(sink=sink.name).warning(
                    "rollback failed (%s); recovery will roll back the leftover", brief(exc)
                )

    def discard_losers(
        self,
        decision: DecisionRecord | None,
        generation: int | None,
        metrics: EpochMetrics,
        log: JobLogger,
        epoch: int | None = None,
    ) -> Steps:
        """Roll back every prepared participant of the epoch (`metrics.epoch` unless given)
        that `decision` does not name (failed, retried or speculative attempts; all of them
        when there is no decision), made by `generation` or an older one. A newer
        generation's are never touched: this coordinator may be the zombie."""
        epoch = metrics.epoch if epoch is None else epoch
        for sink in self.sinks:
            if not isinstance(sink, DistributedSink):
                continue
            with metrics.phase("commit"):
                for handle in sink.prepared_participants(epoch):
                    name = ParticipantName.parse(handle.participant)
                    if decision is not None and decision.commits(handle):
                        continue
                    if name is None or generation is None or name.generation > generation:
                        continue
                    self.roll_back(sink, epoch, handle)
                    log.bind(sink=sink.name).info(
                        "rolled back attempt %s (not in the decision)", handle.participant
                    )
            yield f"after-discard:{sink.name}"


def _by_sink(handles: Iterable[CommitHandle]) -> dict[str, list[CommitHandle]]:
    """`handles` per sink, the sinks and each sink's handles in the order given."""
    grouped: dict[str, list[CommitHandle]] = {}
    for handle in handles:
        grouped.setdefault(handle.sink, []).append(handle)
    return grouped


def _counted(written: Written, metrics: EpochMetrics) -> str:
    """Count a finished write in `metrics`; its crash point's name."""
    name = written.sink.name
    metrics.rows[name] = metrics.rows.get(name, 0) + written.result.rows
    metrics.bytes[name] = metrics.bytes.get(name, 0) + written.result.bytes
    metrics.sink_seconds[name] = metrics.sink_seconds.get(name, 0.0) + written.seconds
    return f"after-write:{written.index}:{name}"


def brief(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def require_own(
    job: str, sink: SinkConnector, handle: CommitHandle, epoch: int | None = None
) -> None:
    """CorruptRecordError unless `handle` (read back from a decision, a marker or a sink's
    leftovers, all of which anyone who can write the storage can forge) names a participant
    of this job and `sink`, of its own epoch (and of `epoch`, when given): a sink builds the
    paths, keys, gids and folders it touches from the participant's name, which is then a
    safe name of its own namespace (core/naming.py)."""
    name = ParticipantName.parse(handle.participant)
    problem = None
    if handle.sink != sink.name:
        problem = f"it names sink {handle.sink!r}"
    elif name is None:
        problem = "its participant is not a participant name"
    elif not name.owned_by(job, sink.name):
        problem = "its participant belongs to another job or sink"
    elif name.epoch != handle.epoch or (epoch is not None and handle.epoch != epoch):
        problem = f"its participant is of epoch {name.epoch}, the handle of {handle.epoch}"
    if problem is None:
        return
    raise CorruptRecordError(
        f"a commit handle read back for sink {sink.name!r} is not one of its own: {problem} "
        f"(participant {handle.participant[:200]!r}); nothing was committed or removed for it",
        job=job,
        sink=sink.name,
        epoch=handle.epoch,
        fix="the sink's storage or the decision store holds a record this job did not write "
        "(edited, copied from elsewhere, or hostile): check who writes there, remove the "
        "record, then restart",
    )


def require_part_of(job: str, epoch: int, handle: CommitHandle, order: dict[str, int]) -> None:
    """UsageError unless `handle` (returned by a worker) is a part of epoch `epoch` of one of
    the sinks in `order`."""
    if handle.sink not in order or handle.epoch != epoch:
        raise UsageError(
            f"a worker returned participant {handle.participant} of sink {handle.sink!r}, "
            f"epoch {handle.epoch}: not a part of this epoch",
            job=job,
            epoch=epoch,
        )


def _require_record_batch(batch: object, job: str, epoch: int) -> None:
    import pyarrow as pa

    if not isinstance(batch, pa.RecordBatch):
        raise SchemaMismatchError(
            f"expected pyarrow.RecordBatch, got {type(batch).__name__}",
            job=job,
            epoch=epoch,
            fix="pass record batches (e.g. table.to_batches())",
        )
