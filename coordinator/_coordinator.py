"""The checkpoint coordinator: one per job, on the driver.

It drives every sink through each epoch (design section 3) and resolves what earlier
generations left behind (section 4). It knows the sink protocol, never a particular sink.

Both procedures are generators that yield the name of each step as it completes (the crash
points of docs/protocol.md) and return their result; `start()` and `run_epoch()` simply run
them to the end. A test can stop iterating at any step to simulate a crash (the generator is
abandoned: nothing is rolled back or closed) and, later, resume it to play a zombie.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Generator, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from manifest import DecisionRecord, DecisionStore
from sinks import (
    CommitHandle,
    DeliveryGuarantee,
    DistributedSink,
    LastResource,
    OpenContext,
    SinkConnector,
)
from sinks.errors import (
    CommitIncompleteError,
    ConfigError,
    DurableSinkError,
    EpochOrderError,
    FencedError,
    InDoubtError,
    SchemaMismatchError,
)
from sinks.naming import ParticipantName

from ._log import JobLogger
from ._metrics import EpochMetrics, JobTotals
from ._recovery import RecoveryReport, Resolution, resolve
from .validation import validate

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")
Steps = Generator[str, None, T]


class EpochOutcome(enum.StrEnum):
    COMMITTED = "committed"
    #: The epoch was already decided (Spark replayed a batch that had landed, or a crash
    #: happened after the decision): its decided participants were committed, the data given
    #: this time was ignored.
    ALREADY_COMMITTED = "already-committed"

    def __repr__(self) -> str:
        return f"EpochOutcome.{self.name}"


@dataclass(frozen=True)
class EpochResult:
    epoch: int
    outcome: EpochOutcome
    decision: DecisionRecord
    metrics: EpochMetrics


@dataclass(frozen=True)
class RetryPolicy:
    """How phase-2 commits retry transient errors (never anything else)."""

    attempts: int = 8
    max_seconds: float = 60.0
    first_wait: float = 0.05
    max_wait: float = 5.0

    def retrying(self) -> Retrying:
        return Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, DurableSinkError) and e.retriable),
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.max_seconds),
            wait=wait_exponential(multiplier=self.first_wait, max=self.max_wait),
            reraise=True,
        )


class Coordinator:
    """Exactly-once epochs across `sinks`, with `store` holding the decisions.

    Call `start()` once (validation, fencing, recovery), then `run_epoch()` per Spark batch.
    With `one_phase` (the default), a job whose only sink can carry the decision in its own
    commit (a `LastResource`, e.g. Postgres) commits each epoch in one transaction of that
    sink: no prepare, no decision-store record (design section 3).
    `source` names the stream the epochs come from (e.g. a Spark query id); it is kept in each
    decision, and replaying a decided epoch from another source raises EpochOrderError
    instead of silently keeping the other source's data.
    After `run_epoch` returns, every sink holds the epoch's rows exactly once. If it raises:
    - before the decision (any error, incl. FencedError): every participant was rolled back;
      replaying the epoch writes it afresh;
    - CommitIncompleteError / InDoubtError: the decision may be durable; nothing was rolled
      back; replaying the epoch (or restarting) finishes it: a restarted Spark query replays it.
    """

    def __init__(
        self,
        job_id: str,
        sinks: Sequence[SinkConnector],
        store: DecisionStore,
        *,
        guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE,
        executor_mode: bool = False,
        commit_retry: RetryPolicy = RetryPolicy(),
        retain_epochs: int = 10_000,
        one_phase: bool = True,
        source: str | None = None,
        on_step: Callable[[str], None] | None = None,
    ) -> None:
        if retain_epochs < 1:
            raise ConfigError(
                "retain_epochs must be >= 1", job=job_id, fix="leave the default (10,000)"
            )
        self.job_id = job_id
        self.sinks = list(sinks)
        self.store = store
        self.guarantee = guarantee
        self.executor_mode = executor_mode
        self.commit_retry = commit_retry
        self.retain_epochs = retain_epochs
        self.one_phase = one_phase
        self.source = source
        self.on_step = on_step
        self.log = JobLogger(job_id)
        self.totals = JobTotals()
        self.last_metrics: EpochMetrics | None = None
        self.generation: int | None = None
        self._last_resource: LastResource | None = None

    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self.sinks)
        return f"Coordinator(job={self.job_id!r}, sinks=[{names}], generation={self.generation})"

    # -- driving -------------------------------------------------------------------------------
    def _drive(self, steps: Steps[T]) -> T:
        while True:
            try:
                step = next(steps)
            except StopIteration as done:
                result: T = done.value
                return result
            if self.on_step is not None:
                self.on_step(step)

    def start(self, adopt: Collection[str] = (), *, recover: bool = True) -> RecoveryReport:
        """Validate, claim a new generation (fencing every older coordinator), open the sinks
        and resolve every participant earlier generations left prepared, except those named
        in `adopt`: parts that workers prepared for an epoch this coordinator is about to
        decide (the Spark data source's commit runs in a fresh process each batch). With
        `recover=False` leftovers stay for the next coordinator that recovers (a check of a
        job's configuration and servers that must not touch an epoch in flight)."""
        return self._drive(self.start_steps(adopt, recover=recover))

    def run_epoch(self, epoch: int, batches: Iterable[pa.RecordBatch]) -> EpochResult:
        """Write `batches` as epoch `epoch` to every sink, exactly once."""
        return self._drive(self.epoch_steps(epoch, batches))

    def run_distributed_epoch(
        self, epoch: int, prepare: Callable[[int], Sequence[CommitHandle]]
    ) -> EpochResult:
        """Executor mode: `prepare(generation)` has workers prepare the epoch's parts
        (`prepare_part`) and returns the winning handle of each part; this decides and
        commits them, then rolls back every other prepared attempt of the epoch. `prepare` is
        not called when the epoch is already decided."""
        return self._drive(self.distributed_epoch_steps(epoch, prepare))

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.store.close()

    # -- start-up and recovery -----------------------------------------------------------------
    def start_steps(
        self, adopt: Collection[str] = (), *, recover: bool = True
    ) -> Steps[RecoveryReport]:
        if self.generation is not None:
            raise ConfigError(f"{self!r} was already started", job=self.job_id)
        self._last_resource = validate(
            self.job_id,
            self.sinks,
            self.store,
            self.guarantee,
            executor_mode=self.executor_mode,
            one_phase=self.one_phase,
        )
        generation = self.store.open(self.job_id)
        self.log.info("claimed generation %d; older coordinators are fenced", generation)
        yield "recovery:after-fence"
        for sink in self.sinks:
            commit_point = sink is self._last_resource or (
                self._at_least_once and isinstance(sink, LastResource)
            )
            sink.open(OpenContext(self.job_id, sink.name, generation, commit_point))
            sink.health_check()
            yield f"recovery:after-open:{sink.name}"
        self.generation = generation
        report = RecoveryReport(generation)
        for sink in self.sinks if recover else ():
            log = self.log.bind(sink=sink.name)
            for handle in sink.recover_prepared():
                if handle.participant in adopt:
                    continue
                decision = self._decision_for(handle.epoch)
                action = resolve(decision, handle)
                if action is Resolution.COMMIT:
                    self._commit(sink, handle)
                    report.committed.append(handle)
                else:
                    self._with_retry(partial(sink.rollback_epoch, handle.epoch, handle))
                    report.rolled_back.append(handle)
                log.bind(epoch=handle.epoch).info(
                    "recovery: %s leftover participant %s", action.value, handle.participant
                )
                yield f"recovery:after-resolve:{sink.name}:{handle.participant}"
        self.totals.recovered_commits += len(report.committed)
        self.totals.recovered_rollbacks += len(report.rolled_back)
        self.log.info("recovery done: %s", report)
        return report

    def decision(self, epoch: int) -> DecisionRecord | None:
        """The durable decision of `epoch`: from the store or, when a sink is the commit
        point, from the record its commit carried (recovery trusts that one)."""
        return self.store.get(epoch) or self._carried_decision(epoch)

    def _carried_decision(self, epoch: int) -> DecisionRecord | None:
        last = self._last_resource
        if last is None:
            return None
        landed = last.last_committed_epoch()
        if landed is None or epoch > landed:
            return None  # nothing committed this epoch, so no commit carried its decision
        carried = last.read_decision(epoch)
        if carried is None:
            return None
        return DecisionRecord.from_json(carried, source=f"{last.name} commit")

    def _caches_decisions(self) -> bool:
        """Whether decisions the commit point carried are copied into the store. A
        non-resumable last resource (Kafka) is slow to read back, so the store caches its
        decisions; a one-phase sink answers read_decision with one indexed read, and an extra
        durable write per epoch would cost what one-phase commit saves."""
        last = self._last_resource
        return last is not None and not last.capabilities().resumable_prepare

    def _store_holds_decisions(self) -> bool:
        """False in one-phase mode: the commit point's sink holds them, the store only fences
        generations (so there is nothing to mark finished or expire)."""
        return self._last_resource is None or self._caches_decisions()

    def _decision_for(self, epoch: int) -> DecisionRecord | None:
        decision = self.store.get(epoch)
        if decision is not None:
            return decision
        carried = self._carried_decision(epoch)
        if carried is None or not self._caches_decisions():
            return carried
        return self.store.put(carried)

    # -- one epoch -----------------------------------------------------------------------------
    @property
    def _at_least_once(self) -> bool:
        return self.guarantee is DeliveryGuarantee.AT_LEAST_ONCE and not self.executor_mode

    def epoch_steps(self, epoch: int, batches: Iterable[pa.RecordBatch]) -> Steps[EpochResult]:
        if self.generation is None:
            raise ConfigError("call start() before running epochs", job=self.job_id, epoch=epoch)
        if self._at_least_once:
            return (yield from self._at_least_once_steps(epoch, batches))
        log = self.log.bind(epoch=epoch)
        metrics = EpochMetrics(epoch)
        yield "epoch-start"
        decided = self._lookup(epoch, metrics)
        if decided is not None:
            log.info("already decided by generation %d: finishing it", decided.generation)
            yield from self._finish(decided, metrics, log)
            self.totals.epochs_skipped += 1
            return self._result(EpochOutcome.ALREADY_COMMITTED, decided, metrics)

        last = self._last_resource
        ordered = [s for s in self.sinks if s is not last] + ([last] if last is not None else [])
        begun: list[SinkConnector] = []
        handles: dict[str, CommitHandle] = {}
        record: DecisionRecord | None = None
        try:
            with metrics.phase("begin"):
                for sink in ordered:
                    sink.begin_epoch(epoch)
                    begun.append(sink)
            for sink in ordered:
                yield f"after-begin:{sink.name}"
            yield from self._write(epoch, ordered, batches, metrics)
            for sink in ordered:
                with metrics.phase("pre_commit"):
                    handles[sink.name] = sink.pre_commit(epoch)
                yield f"after-pre-commit:{sink.name}"
            record = DecisionRecord(
                self.job_id,
                epoch,
                self.generation,
                tuple(handles[s.name] for s in ordered),
                source=self.source,
            )
            with metrics.phase("decision"):
                if last is None:
                    winner = self.store.put(record)
                else:
                    last.commit_with_decision(epoch, handles[last.name], record.to_json())
                    winner = record
        except InDoubtError:
            log.exception(
                "decision outcome unknown: nothing rolled back; replay or restart settles it"
            )
            self.totals.epochs_failed += 1
            raise
        except Exception as exc:
            self.totals.epochs_failed += 1
            log.warning("epoch failed before its decision (%s): rolling back", _brief(exc))
            self._roll_back(epoch, begun, handles, log)
            raise
        yield "after-decision"

        if self._caches_decisions():
            self._cache_decision(record, log)
        if winner != record:
            log.info("generation %d decided this epoch first: yielding to it", winner.generation)
            self._roll_back(epoch, begun, handles, log)
            self._check_source(winner)
            yield from self._finish(winner, metrics, log)
            return self._result(EpochOutcome.ALREADY_COMMITTED, winner, metrics)
        yield from self._finish(record, metrics, log)
        if self._store_holds_decisions():
            with metrics.phase("finish"):
                self.store.expire(epoch - self.retain_epochs + 1)
        self._count_committed(metrics)
        log.info(
            "committed %d rows in %d batches (protocol %.1f ms)",
            sum(h.rows for h in record.handles),
            metrics.batches,
            metrics.protocol_seconds * 1e3,
        )
        return self._result(EpochOutcome.COMMITTED, record, metrics)

    def distributed_epoch_steps(
        self, epoch: int, prepare: Callable[[int], Sequence[CommitHandle]]
    ) -> Steps[EpochResult]:
        generation = self.generation
        if generation is None:
            raise ConfigError("call start() before running epochs", job=self.job_id, epoch=epoch)
        if not self.executor_mode:
            raise ConfigError(
                "distributed epochs need a coordinator made with executor_mode=True",
                job=self.job_id,
                epoch=epoch,
            )
        log = self.log.bind(epoch=epoch)
        metrics = EpochMetrics(epoch)
        yield "epoch-start"
        decided = self._lookup(epoch, metrics)
        if decided is not None:
            log.info("already decided by generation %d: finishing it", decided.generation)
            yield from self._finish(decided, metrics, log)
            yield from self._discard_losers(decided, metrics, log)
            self.totals.epochs_skipped += 1
            return self._result(EpochOutcome.ALREADY_COMMITTED, decided, metrics)
        order = {s.name: i for i, s in enumerate(self.sinks)}
        try:
            with metrics.phase("write"):
                handles = list(prepare(generation))
            for handle in handles:
                self._require_part_of(epoch, handle, order)
                metrics.rows[handle.sink] = metrics.rows.get(handle.sink, 0) + handle.rows
                metrics.bytes[handle.sink] = metrics.bytes.get(handle.sink, 0) + handle.bytes
            metrics.batches = len(handles)
            yield "after-prepare"
            record = DecisionRecord(
                self.job_id,
                epoch,
                generation,
                tuple(sorted(handles, key=lambda h: (order[h.sink], h.participant))),
                source=self.source,
            )
            with metrics.phase("decision"):
                winner = self.store.put(record)
        except InDoubtError:
            log.exception(
                "decision outcome unknown: nothing rolled back; replay or restart settles it"
            )
            self.totals.epochs_failed += 1
            raise
        except Exception as exc:
            self.totals.epochs_failed += 1
            log.warning("epoch failed before its decision (%s): rolling back", _brief(exc))
            for _ in self._discard_losers(None, metrics, log):
                pass
            raise
        yield "after-decision"
        if winner != record:
            log.info("generation %d decided this epoch first: yielding to it", winner.generation)
            self._check_source(winner)
            record = winner
        yield from self._finish(record, metrics, log)
        yield from self._discard_losers(record, metrics, log)
        with metrics.phase("finish"):
            self.store.expire(epoch - self.retain_epochs + 1)
        outcome = (
            EpochOutcome.COMMITTED
            if record.generation == generation
            else (EpochOutcome.ALREADY_COMMITTED)
        )
        self._count_committed(metrics)
        log.info(
            "committed %d rows in %d participants (protocol %.1f ms)",
            sum(h.rows for h in record.handles),
            len(record.handles),
            metrics.protocol_seconds * 1e3,
        )
        return self._result(outcome, record, metrics)

    def _require_part_of(self, epoch: int, handle: CommitHandle, order: dict[str, int]) -> None:
        if handle.sink not in order or handle.epoch != epoch:
            raise ConfigError(
                f"a worker returned participant {handle.participant} of sink {handle.sink!r}, "
                f"epoch {handle.epoch}: not a part of this epoch",
                job=self.job_id,
                epoch=epoch,
            )

    def _discard_losers(
        self, decision: DecisionRecord | None, metrics: EpochMetrics, log: JobLogger
    ) -> Steps[None]:
        """Roll back every prepared participant of the epoch that `decision` does not name
        (failed, retried or speculative attempts; all of them when there is no decision),
        made by this generation or an older one. A newer generation's are never touched:
        this coordinator may be the zombie."""
        epoch = metrics.epoch
        for sink in self.sinks:
            if not isinstance(sink, DistributedSink):
                continue
            with metrics.phase("commit"):
                for handle in sink.prepared_participants(epoch):
                    name = ParticipantName.parse(handle.participant)
                    if decision is not None and decision.commits(handle):
                        continue
                    if name is None or self.generation is None or name.generation > self.generation:
                        continue
                    self._with_retry(partial(sink.rollback_epoch, epoch, handle))
                    log.bind(sink=sink.name).info(
                        "rolled back attempt %s (not in the decision)", handle.participant
                    )
            yield f"after-discard:{sink.name}"

    def _at_least_once_steps(
        self, epoch: int, batches: Iterable[pa.RecordBatch]
    ) -> Steps[EpochResult]:
        """At-least-once: each sink commits the epoch on its own, in one transaction where it
        can (a LastResource commits with its marker, no prepare), with no decision across
        sinks. A replay skips the sinks whose marker shows the epoch; a crash between two
        sinks' commits leaves the epoch in some sinks only until Spark replays it."""
        generation = self.generation
        assert generation is not None
        log = self.log.bind(epoch=epoch)
        metrics = EpochMetrics(epoch)
        yield "epoch-start"
        with metrics.phase("lookup"):
            todo = []
            for sink in self.sinks:
                landed = sink.last_committed_epoch()
                if landed is None or landed < epoch:
                    todo.append(sink)
        begun: list[SinkConnector] = []
        handles: dict[str, CommitHandle] = {}
        try:
            with metrics.phase("begin"):
                for sink in todo:
                    sink.begin_epoch(epoch)
                    begun.append(sink)
            if todo:
                yield from self._write(epoch, todo, batches, metrics)
            for sink in todo:
                with metrics.phase("pre_commit"):
                    handles[sink.name] = sink.pre_commit(epoch)
        except Exception as exc:
            self.totals.epochs_failed += 1
            log.warning("epoch failed before its commits (%s): rolling back", _brief(exc))
            self._roll_back(epoch, begun, handles, log)
            raise
        record = DecisionRecord(
            self.job_id, epoch, generation, tuple(handles.values()), source=self.source
        )
        for sink in todo:
            handle = handles[sink.name]
            with metrics.phase("commit"):
                if isinstance(sink, LastResource):
                    sink.commit_with_decision(epoch, handle, record.to_json())
                else:
                    self._commit(sink, handle)
            yield f"after-commit:{sink.name}"
        self._count_committed(metrics)
        outcome = EpochOutcome.COMMITTED if todo else EpochOutcome.ALREADY_COMMITTED
        return self._result(outcome, record, metrics)

    def _write(
        self,
        epoch: int,
        sinks: Sequence[SinkConnector],
        batches: Iterable[pa.RecordBatch],
        metrics: EpochMetrics,
    ) -> Steps[None]:
        """Stream every batch into every sink (one pass over `batches`)."""
        for index, batch in enumerate(batches):
            _require_record_batch(batch, self.job_id, epoch)
            metrics.batches += 1
            for sink in sinks:
                with metrics.phase("write"):
                    written = sink.write_batch(batch)
                metrics.rows[sink.name] = metrics.rows.get(sink.name, 0) + written.rows
                metrics.bytes[sink.name] = metrics.bytes.get(sink.name, 0) + written.bytes
                yield f"after-write:{index}:{sink.name}"

    def _lookup(self, epoch: int, metrics: EpochMetrics) -> DecisionRecord | None:
        """The epoch's decision, checked to come from this source; with none, a check that
        no later epoch (or this one) already landed."""
        with metrics.phase("lookup"):
            decided = self._decision_for(epoch)
            if decided is None:
                self._check_order(epoch)
        if decided is not None:
            self._check_source(decided)
        return decided

    def _count_committed(self, metrics: EpochMetrics) -> None:
        self.totals.epochs_committed += 1
        self.totals.rows += sum(metrics.rows.values())
        self.totals.bytes += sum(metrics.bytes.values())

    def _check_source(self, decided: DecisionRecord) -> None:
        if self.source is None or decided.source is None or decided.source == self.source:
            return
        raise EpochOrderError(
            f"epoch {decided.epoch} was already committed with data of source "
            f"{decided.source!r}; this coordinator writes source {self.source!r}: another "
            "query writes under the same job id",
            job=self.job_id,
            epoch=decided.epoch,
            fix="give each streaming query its own job_id (a query keeps its id across "
            "restarts from the same checkpoint)",
        )

    def _check_order(self, epoch: int) -> None:
        """No decision for `epoch`: make sure nothing later (or this epoch) already landed."""
        latest = self.store.latest_epoch()
        if latest is not None and latest > epoch:
            raise EpochOrderError(
                f"asked to write epoch {epoch} but epoch {latest} is already committed",
                job=self.job_id,
                epoch=epoch,
                fix="the query's checkpoint was reset or deleted, or another query uses this "
                "job_id: give the query a new job_id, or restore its checkpoint",
            )
        for sink in self.sinks:
            landed = sink.last_committed_epoch()
            if landed is not None and landed >= epoch:
                raise EpochOrderError(
                    f"the sink already holds epoch {landed} but the decision store has no "
                    f"decision for epoch {epoch}",
                    job=self.job_id,
                    sink=sink.name,
                    epoch=epoch,
                    fix="the decision store was reset or is not this job's, or the sink's data "
                    "is shared with another job: point the job at its own store and sink",
                )

    def _finish(
        self, decision: DecisionRecord, metrics: EpochMetrics, log: JobLogger
    ) -> Steps[None]:
        """Commit every participant of a decided epoch (idempotent), then mark it finished.
        The last resource's participant committed with the decision itself."""
        by_name = {s.name: s for s in self.sinks}
        last = self._last_resource
        for handle in decision.handles:
            sink = by_name.get(handle.sink)
            if sink is None:
                raise CommitIncompleteError(
                    f"the decision names sink {handle.sink!r}, which this job no longer has",
                    job=self.job_id,
                    epoch=decision.epoch,
                    fix="restart the job with the same sinks to finish the epoch",
                )
            if sink is last:
                continue
            with metrics.phase("commit"):
                self._commit(sink, handle)
            yield f"after-commit:{sink.name}"
        if self._store_holds_decisions():
            with metrics.phase("finish"):
                self.store.mark_finished(decision.epoch)
        yield "after-finish"

    def _commit(self, sink: SinkConnector, handle: CommitHandle) -> None:
        try:
            self._with_retry(lambda: sink.commit_epoch(handle.epoch, handle))
        except DurableSinkError as exc:
            raise CommitIncompleteError(
                f"the epoch is decided but committing participant {handle.participant} failed: "
                f"{exc}",
                job=self.job_id,
                sink=sink.name,
                epoch=handle.epoch,
                fix="replaying the epoch or restarting the job finishes the commit",
            ) from exc

    def _with_retry(self, call: Callable[[], T]) -> T:
        for attempt in self.commit_retry.retrying():
            with attempt:
                return call()
        raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover

    def _roll_back(
        self,
        epoch: int,
        begun: Sequence[SinkConnector],
        handles: dict[str, CommitHandle],
        log: JobLogger,
    ) -> None:
        """Undo every participant of this attempt. A failure here is logged, not raised: the
        original error matters more, and recovery rolls back whatever is left (presumed
        abort)."""
        for sink in begun:
            try:
                sink.rollback_epoch(epoch, handles.get(sink.name))
            except Exception as exc:  # noqa: BLE001 - see docstring
                log.bind(sink=sink.name).warning(
                    "rollback failed (%s); recovery will roll back the leftover", _brief(exc)
                )

    def _cache_decision(self, record: DecisionRecord, log: JobLogger) -> None:
        try:
            self.store.put(record)
        except FencedError:
            log.warning("a newer coordinator started: it reads this decision from the sink")
        except DurableSinkError as exc:
            log.warning("could not cache the decision in the store (%s)", _brief(exc))

    def _result(
        self, outcome: EpochOutcome, decision: DecisionRecord, metrics: EpochMetrics
    ) -> EpochResult:
        self.last_metrics = metrics
        return EpochResult(decision.epoch, outcome, decision, metrics)


def _require_record_batch(batch: object, job: str, epoch: int) -> None:
    import pyarrow as pa

    if not isinstance(batch, pa.RecordBatch):
        raise SchemaMismatchError(
            f"expected pyarrow.RecordBatch, got {type(batch).__name__}",
            job=job,
            epoch=epoch,
            fix="pass record batches (e.g. table.to_batches())",
        )


def _brief(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
