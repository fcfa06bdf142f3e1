"""The checkpoint coordinator: one per job, on the driver.

It drives every sink through each epoch (docs/protocol.md, "One epoch") and resolves what
earlier generations left behind ("Recovery"). It knows the sink protocol, never a particular
sink. The pieces it uses: the decision lookup (`_decisions`), what it does to the sinks
besides beginning and preparing them (`_participants`), retries (`_retry`), the recovery table
(`_recovery`) and validation (`validation`).

Every procedure is a generator that yields the name of each step as it completes (the crash
points of docs/protocol.md) and returns its result; `start()`, `run_epoch()` and
`run_distributed_epoch()` simply run them to the end. A test can stop iterating at any step to
simulate a crash (the generator is abandoned: nothing is rolled back or closed) and, later,
resume it to play a zombie.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from durable_sinks.core.bad_rows import BadRowCap, RefusalCounts, WritePolicy
from durable_sinks.core.errors import ConfigError, InDoubtError, ParticipantLostError, UsageError
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.protocol import (
    CommitHandle,
    DeliveryGuarantee,
    LastResource,
    OpenContext,
    PublishingSink,
    SinkConnector,
    TaskBriefing,
)
from durable_sinks.core.text_enum import TextEnum
from durable_sinks.manifest import DecisionRecord, DecisionStore

from ._dead_letters import DeadLetterPass, write_dead_letters
from ._decisions import DecisionBook
from ._expiry import SinkExpiry
from ._lost_epochs import LostEpochCheck
from ._metrics import EpochMetrics, JobTotals
from ._participants import Participants, brief, require_part_of
from ._phase2 import Phase2
from ._recovery import RecoveryReport, Resolution, require_no_newer, resolve
from ._replay import ReplayCheck, unproven_replay
from ._retry import RetryPolicy
from ._streams import StreamCheck
from ._watch import SLOW_PHASE_LOG_S, Watch
from .validation import transaction_members, validate

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")
Steps = Generator[str, None, T]
DEFAULT_RETRY = RetryPolicy()
#: How many epochs back an executor-mode epoch sweeps a second time for late attempts
#: (Coordinator._sweep_late_attempts).
LATE_SWEEP_EPOCHS = 10
#: What an executor-mode epoch given again shows of its rows (none reach the driver).
EXECUTOR_MODE_ROWS = "rows the driver does not see (executor mode)"


class EpochOutcome(TextEnum):
    COMMITTED = "committed"
    #: The epoch was already decided (Spark replayed a batch that had landed, or a crash
    #: happened after the decision): its decided participants were committed, the data given
    #: this time was not written (only compared: the replay check).
    ALREADY_COMMITTED = "already_committed"

    def __repr__(self) -> str:
        return f"EpochOutcome.{self.name}"


@dataclass(frozen=True)
class EpochResult:
    epoch: int
    outcome: EpochOutcome
    decision: DecisionRecord
    metrics: EpochMetrics


class Coordinator:
    """Exactly-once epochs across `sinks`, with `store` holding the decisions.

    Call `start()` once (validation, fencing, recovery), then `run_epoch()` per Spark batch.
    With `one_phase` (the default), a job whose only sink can carry the decision in its own
    commit (a `LastResource`, e.g. Postgres) commits each epoch in one transaction of that
    sink: no prepare, no decision-store record (docs/protocol.md).
    `concurrent_writes`: sinks write at once, while the next batch is read (`_fanout`).
    `source` names the stream the epochs come from (e.g. a Spark query id); it is kept in each
    decision, and a decided epoch given again by another source raises EpochOrderError
    instead of silently keeping the other source's data. Where the stream is not known
    (`source` None, or a decision that names none) nothing is assumed: a decided epoch given
    again is taken for a replay only when its rows match the summary the decision recorded
    (driver mode records one whatever `replay_check` says); otherwise, and always in executor
    mode, whose rows the coordinator never sees, it raises EpochOrderError after finishing the
    decided epoch, with nothing of the batch written.
    `first_epoch` is the epoch the stream's first batch is (its batch b is epoch
    first_epoch + b): 0 for the job's first stream, the job's newest epoch + 1 for a stream
    started from a new checkpoint; checked against the newest decision at the first epoch
    with the source known (ConfigError / EpochOrderError before anything is written:
    `_streams`), and kept in each decision.
    `replay_check` ("warn", "fail", "off"): compare a replay of a decided epoch with the rows
    it committed (driver mode; `_replay`).
    `watch.snapshot()` says which epoch is in flight, its phase and the sink calls it waits
    on, from any thread; while a phase runs longer than `slow_phase_log_s` (0: never) a
    warning names them, again every `slow_phase_log_s` (`_watch`).
    `policy` says what the sinks do with bad rows and new columns (core/bad_rows.py); with
    `on_bad_rows="dead_letter"`, rows the sinks refuse go to `dead_letter`, one more
    participant of the same epoch and decision (`_dead_letters`), at most `bad_row_cap` of
    them per sink and epoch.
    With `background_commits`, an epoch's phase 2 (commits, publishes, the finish mark) runs
    in a background thread once its decision is durable, and `run_epoch` returns then: the
    epoch's outcome is fixed by its decision (a crash is rolled forward by the next start's
    recovery), but its rows become visible only when phase 2 ends. The next epoch waits for
    it before its own decision, as do a replay and `close()`; a phase 2 that failed is run
    again there, in the caller's thread, raising as `run_epoch` would have. Only for jobs
    whose every sink can commit beside its next epoch's writes
    (`SinkCapabilities.commits_beside_writes`); for others it is off, logged at start.
    Without it, after `run_epoch` returns, every sink holds the epoch's rows exactly once.
    If `run_epoch` raises:
    - before the decision (any error, incl. FencedError): every participant was rolled back;
      replaying the epoch writes it afresh;
    - CommitIncompleteError / InDoubtError: the decision may be durable; nothing was rolled
      back; replaying the epoch (or restarting) finishes it: a restarted Spark query replays it.
    A coordinator is used from one thread at a time: a call made while another call runs
    (from another thread) raises UsageError and does nothing.
    """

    def __init__(
        self,
        job_id: str,
        sinks: Sequence[SinkConnector],
        store: DecisionStore,
        *,
        guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE,
        executor_mode: bool = False,
        commit_retry: RetryPolicy = DEFAULT_RETRY,
        retain_epochs: int = 10_000,
        one_phase: bool = True,
        concurrent_writes: bool = True,
        source: str | None = None,
        on_step: Callable[[str], None] | None = None,
        replay_check: str = "warn",
        policy: WritePolicy | None = None,
        dead_letter: SinkConnector | None = None,
        bad_row_cap: BadRowCap | None = None,
        slow_phase_log_s: float = SLOW_PHASE_LOG_S,
        first_epoch: int = 0,
        background_commits: bool = False,
    ) -> None:
        if retain_epochs < 1:
            raise ConfigError(
                "retain_epochs must be >= 1", job=job_id, fix="leave the default (10,000)"
            )
        self.job_id = job_id
        #: The sinks the epochs' rows are written to.
        self.targets = list(sinks)
        self.dead_letter = dead_letter
        #: Every participant's sink: the targets and the dead-letter sink.
        self.sinks = [*self.targets, *([dead_letter] if dead_letter is not None else [])]
        self.policy = policy if policy is not None else WritePolicy()
        self.bad_row_cap = bad_row_cap if bad_row_cap is not None else BadRowCap()
        self.store = store
        self.guarantee = guarantee
        self.executor_mode = executor_mode
        self.commit_retry = commit_retry
        self.retain_epochs = retain_epochs
        self.one_phase = one_phase
        self.source = source
        self.on_step = on_step
        self.log = JobLogger(job_id)
        #: The epoch in flight (`watch.snapshot()`), logged while a phase runs long.
        self.watch = Watch(self.log, slow_phase_log_s)
        self.totals = JobTotals()
        self.last_metrics: EpochMetrics | None = None
        self.generation: int | None = None
        #: The generation this coordinator claimed in the store (set as soon as it is claimed,
        #: before start() has finished; None until then).
        self.claimed_generation: int | None = None
        self.decisions = DecisionBook(job_id, store, self.sinks, None)
        #: The sinks whose participants ride in the last resource's transaction (validation's
        #: transaction_members; set at start).
        self._transaction: tuple[str, ...] = ()
        self.lost_epochs = LostEpochCheck(job_id, self.decisions, self.sinks)
        #: The sinks' per-epoch bookkeeping beyond `retain_epochs`, expired as epochs commit.
        self.expiry = SinkExpiry(self.sinks, retain_epochs, self.watch)
        #: The epoch of the stream's first batch, checked against the job's decisions (_streams).
        self.streams = StreamCheck(job_id, self.decisions, first_epoch)
        self.participants = Participants(
            job_id,
            self.sinks,
            commit_retry,
            concurrent_writes,
            occasional=dead_letter,
            watch=self.watch,
        )
        self._in_use = threading.Lock()
        self.replay = ReplayCheck(job_id, replay_check)
        #: The decisions of the last epochs this coordinator ran in executor mode (the
        #: newest LATE_SWEEP_EPOCHS + 1), by epoch, and the first epoch it ran.
        self._decided: dict[int, DecisionRecord] = {}
        self._first_distributed: int | None = None
        self.background_commits = background_commits
        #: Phase 2 of the last epoch decided, running in the background (`_phase2`).
        self._phase2 = Phase2(job_id, self.log)

    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self.sinks)
        return f"Coordinator(job={self.job_id!r}, sinks=[{names}], generation={self.generation})"

    # -- driving -------------------------------------------------------------------------------
    def _drive(self, steps: Steps[T], epoch: int | None = None) -> T:
        """Run `steps` to the end (`on_step` after each); `epoch`: the epoch they run, told to
        the watch while they do."""
        if not self._in_use.acquire(blocking=False):
            steps.close()
            raise UsageError(
                "this coordinator is already running a call in another thread; its sinks and "
                "decisions would interleave",
                job=self.job_id,
                fix="one coordinator per thread, or serialise the calls (durable_sink's writer "
                "does); one durable_sink(...) per streaming query",
            )
        if epoch is not None:
            self.watch.begin(epoch)
        try:
            while True:
                try:
                    step = next(steps)
                except StopIteration as done:
                    result: T = done.value
                    return result
                if self.on_step is not None:
                    self.on_step(step)
        finally:
            if epoch is not None:
                self.watch.end()
            self._in_use.release()

    def start(
        self,
        adopt: Collection[str] = (),
        *,
        recover: bool = True,
        successor_of: int | None = None,
    ) -> RecoveryReport:
        """Validate, claim a new generation (fencing every older coordinator), open the sinks
        and resolve every participant earlier generations left prepared, except those named
        in `adopt`: parts that workers prepared for an epoch this coordinator is about to
        decide (the Spark data source's commit runs in a fresh process each batch). With
        `recover=False` leftovers stay for the next coordinator that recovers (a check of a
        job's configuration and servers that must not touch an epoch in flight).
        With `successor_of=g` the coordinator takes over from generation g of the same driver
        (riding out an outage): it refuses (FencedError) when another driver has claimed a
        generation since, rather than fencing that newer driver.
        After recovery (exactly once only) it checks that no sink lost committed epochs
        (`_lost_epochs`): CommittedEpochLostError, before anything is written; the first
        `run_epoch` checks that Spark's checkpoint did not skip past the newest decision."""
        return self._drive(self.start_steps(adopt, recover=recover, successor_of=successor_of))

    def run_epoch(self, epoch: int, batches: Iterable[pa.RecordBatch]) -> EpochResult:
        """Write `batches` as epoch `epoch` to every sink, exactly once."""
        return self._drive(self.epoch_steps(epoch, batches), epoch)

    def run_distributed_epoch(
        self, epoch: int, prepare: Callable[[int], Sequence[CommitHandle]]
    ) -> EpochResult:
        """Executor mode: `prepare(generation)` has workers prepare the epoch's parts
        (`prepare_part`) and returns the winning handle of each part; this decides and
        commits them, then rolls back every other prepared attempt of the epoch. `prepare` is
        not called when the epoch is already decided."""
        return self._drive(self.distributed_epoch_steps(epoch, prepare), epoch)

    def task_briefs(self, epoch: int) -> dict[str, bytes]:
        """Executor mode: the task brief of `epoch` of every sink that gives one
        (TaskBriefing), by sink name, for the workers that prepare the epoch's parts
        (`prepare_part(..., briefs=...)`). Call it from `run_distributed_epoch`'s `prepare`,
        which runs only when the epoch is not decided yet."""
        self._started(epoch)
        briefs = {}
        for sink in self.sinks:
            if isinstance(sink, TaskBriefing):
                with self.watch.calling(sink.name, "task_brief"):
                    given = sink.task_brief(epoch)
                if given is not None:
                    briefs[sink.name] = given
        return briefs

    def decision(self, epoch: int) -> DecisionRecord | None:
        """The durable decision of `epoch` (from the store or the commit point's sink)."""
        return self.decisions.decision(epoch)

    def close(self) -> None:
        """Wait for an epoch's phase 2 still running in the background (a failure is logged:
        the next start finishes the epoch), then close the sinks and the store."""
        self._phase2.wait()
        self.watch.close()
        for sink in self.sinks:
            sink.close()
        self.store.close()

    # -- start-up and recovery -----------------------------------------------------------------
    def start_steps(
        self,
        adopt: Collection[str] = (),
        *,
        recover: bool = True,
        successor_of: int | None = None,
    ) -> Steps[RecoveryReport]:
        if self.generation is not None:
            raise UsageError(f"{self!r} was already started", job=self.job_id)
        last = validate(
            self.job_id,
            self.sinks,
            self.store,
            self.guarantee,
            executor_mode=self.executor_mode,
            one_phase=self.one_phase,
            dead_letter=self.dead_letter,
            policy=self.policy,
        )
        self.decisions.last = last
        self._transaction = transaction_members(self.sinks, last)
        if self.background_commits:
            self._phase2.enabled = self._commits_beside_writes(last)
        if successor_of is not None:
            require_no_newer(self.job_id, self.store.peek_generation(self.job_id), successor_of)
        generation = self.store.open(self.job_id)
        self.claimed_generation = generation
        if successor_of is not None:
            require_no_newer(self.job_id, generation - 1, successor_of)
        self.log.info("claimed generation %d; older coordinators are fenced", generation)
        yield "recovery:after-fence"
        for sink in self.sinks:
            commit_point = sink is last or (self._at_least_once and isinstance(sink, LastResource))
            policy = WritePolicy() if sink is self.dead_letter else self.policy
            sink.open(
                OpenContext(
                    self.job_id,
                    sink.name,
                    generation,
                    commit_point,
                    policy=policy,
                    transaction=self._transaction if sink.name in self._transaction else (),
                )
            )
            sink.health_check()
            yield f"recovery:after-open:{sink.name}"
        self.generation = generation
        report = RecoveryReport(generation, ran=recover)
        for sink in self.sinks if recover else ():
            log = self.log.bind(sink=sink.name)
            decided: dict[int, DecisionRecord] = {}
            held: set[int] = set()  # epochs with a participant adopted, still prepared
            to_commit: dict[int, list[CommitHandle]] = {}  # the decisions' copies, by epoch
            for handle in sink.recover_prepared():
                if handle.participant in adopt:
                    report.adopted.append(handle)
                    held.add(handle.epoch)
                    continue
                decision = self.decisions.for_epoch(handle.epoch)
                if resolve(decision, handle) is Resolution.COMMIT and decision is not None:
                    to_commit.setdefault(handle.epoch, []).append(decision.handle_of(handle))
                    decided[handle.epoch] = decision
                    continue
                self.participants.roll_back(sink, handle.epoch, handle)
                report.rolled_back.append(handle)
                log.bind(epoch=handle.epoch).info(
                    "recovery: roll_back leftover participant %s", handle.participant
                )
                yield f"recovery:after-resolve:{sink.name}:{handle.participant}"
            for epoch, handles in sorted(to_commit.items()):
                # An epoch's leftovers at once, as its commit does (executor mode's parts).
                self.participants.commit(sink, handles)
                for handle in handles:
                    report.committed.append(handle)
                    log.bind(epoch=epoch).info(
                        "recovery: commit leftover participant %s", handle.participant
                    )
                    yield f"recovery:after-resolve:{sink.name}:{handle.participant}"
            unpublished = self._unpublished(sink, {*decided, *held})
            if unpublished is not None and self._recommitted(sink, unpublished):
                decided[unpublished.epoch] = unpublished
            for epoch, decision in sorted(decided.items()):
                if self.participants.publish(sink, decision):
                    log.bind(epoch=epoch).info("recovery: published the epoch")
                    yield f"recovery:after-resolve:{sink.name}:publish-{epoch}"
        self.totals.recovered_commits += len(report.committed)
        self.totals.recovered_rollbacks += len(report.rolled_back)
        self.log.info("recovery: %s", report)
        if recover and self.guarantee is DeliveryGuarantee.EXACTLY_ONCE:
            self.lost_epochs.at_start(self.log)
        return report

    def _unpublished(self, sink: SinkConnector, resolved: set[int]) -> DecisionRecord | None:
        """The newest decided epoch when its decision names participants of PublishingSink
        `sink`, none of them found prepared (the epochs in `resolved` had one), and the
        epoch is not published there yet (the sink's last committed epoch is below it), as
        a driver that stopped between the sink's commit and its publish leaves it; else
        None. Only the newest can be: a coordinator finishes each epoch before it begins
        the next."""
        if not isinstance(sink, PublishingSink):
            return None
        newest = self.decisions.newest_at_start()
        if newest is None or newest in resolved:
            return None
        landed = sink.last_committed_epoch()
        if landed is not None and landed >= newest:
            return None
        decision = self.decisions.for_epoch(newest)
        if decision is None or not decision.handles_for(sink.name):
            return None
        return decision

    def _recommitted(self, sink: SinkConnector, decision: DecisionRecord) -> bool:
        """Commit `sink`'s participants of `decision` again (a no-op for a committed one);
        False, publishing nothing, when one is gone: then the sink lost the epoch, which the
        lost-epochs check that follows recovery reports (CommittedEpochLostError)."""
        try:
            self.participants.commit(sink, decision.handles_for(sink.name))
        except ParticipantLostError:
            return False
        return True

    # -- one epoch -----------------------------------------------------------------------------
    @property
    def _at_least_once(self) -> bool:
        return self.guarantee is DeliveryGuarantee.AT_LEAST_ONCE and not self.executor_mode

    def _started(self, epoch: int) -> int:
        if self.generation is None:
            raise UsageError("call start() before running epochs", job=self.job_id, epoch=epoch)
        return self.generation

    @contextlib.contextmanager
    def _undone_on_failure(
        self, epoch: int, log: JobLogger, undo: Callable[[], None], *, decides: bool = True
    ) -> Iterator[None]:
        """Around everything epoch `epoch` does before its decision (`decides`) or, at least
        once, before its commits: a failure counts the epoch as failed and runs `undo` (roll
        back every participant of the attempt) before it is raised, except an InDoubtError of
        this epoch where the block decides: the decision may be durable, so nothing is rolled
        back and a replay or restart settles it. (One of an earlier epoch, whose phase 2 the
        block waits for, leaves this one undecided: it is rolled back.)"""
        try:
            yield
        except Exception as exc:
            self.totals.epochs_failed += 1
            mine = isinstance(exc, InDoubtError) and exc.epoch in (None, epoch)
            if decides and mine:
                log.warning(
                    "decision outcome unknown (%s): nothing rolled back; the next attempt, a "
                    "replay or a restart settles it",
                    brief(exc),
                )
                raise
            what = "its decision" if decides else "its commits"
            log.warning("epoch failed before %s (%s): rolling back", what, brief(exc))
            undo()
            raise

    def epoch_steps(self, epoch: int, batches: Iterable[pa.RecordBatch]) -> Steps[EpochResult]:
        generation = self._started(epoch)
        if self._at_least_once:
            return (yield from self._at_least_once_steps(epoch, batches))
        log = self.log.bind(epoch=epoch)
        metrics = EpochMetrics(epoch, watch=self.watch)
        yield "epoch-start"
        yield from self._phase2.settled(metrics, self._finish, reaching=epoch)
        self.streams.at_epoch(epoch, self.source, log)
        self.lost_epochs.at_epoch(epoch)
        decided = self.decisions.lookup(epoch, metrics)
        if decided is not None:
            known = self.decisions.same_stream(decided, self.source)
            log.info("already decided by generation %d: finishing it", decided.generation)
            yield from self._finish(decided, metrics)
            self.totals.epochs_skipped += 1
            self.replay.check(decided, batches, self.totals, log, stream_known=known)
            return self._result(EpochOutcome.ALREADY_COMMITTED, decided, metrics)

        tally = self.replay.tally(stream_known=self.source is not None)
        last = self.decisions.last
        ordered = [s for s in self.sinks if s is not last] + ([last] if last is not None else [])
        # The dead-letter sink takes part only when the epoch has dead letters, unless it is
        # the commit point, which every epoch needs.
        lazy = self.dead_letter if self.dead_letter is not last else None
        letters = self._letters(epoch)
        begun: list[SinkConnector] = []
        handles: dict[str, CommitHandle] = {}
        with self._undone_on_failure(
            epoch, log, lambda: self.participants.undo(epoch, begun, handles, log)
        ):
            with metrics.phase("begin"):
                for sink in ordered:
                    if sink is not lazy:
                        with self.participants.calling(sink, "begin_epoch"):
                            sink.begin_epoch(epoch)
                        begun.append(sink)
            for sink in begun:
                yield f"after-begin:{sink.name}"
            targets = [s for s in ordered if s is not self.dead_letter]
            self.watch.enter("write")
            yield from self.participants.write(
                epoch, targets, tally.through(batches), metrics, letters
            )
            yield from self._write_dead_letters(epoch, letters, lazy, begun, metrics)
            taking_part = [s for s in ordered if s in begun]
            for sink in taking_part:
                with metrics.phase("pre_commit"), self.participants.calling(sink, "pre_commit"):
                    handles[sink.name] = sink.pre_commit(epoch)
                yield f"after-pre-commit:{sink.name}"
            record = self._record(
                epoch, generation, [handles[s.name] for s in taking_part], metrics
            )
            record = tally.recorded(record)
            yield from self._phase2.settled(metrics, self._finish)
            self.participants.check(taking_part, epoch, handles.values())
            with metrics.phase("decision"):
                if last is None:
                    with self.watch.calling("decision store", "put"):
                        winner = self.store.put(record)
                else:
                    with self.participants.calling(last, "commit_with_decision"):
                        last.commit_with_decision(epoch, handles[last.name], record.to_json())
                    winner = record
        yield "after-decision"

        if self.decisions.caches_decisions:
            self.decisions.cache(record, log)
        if winner != record:
            log.info("generation %d decided this epoch first: yielding to it", winner.generation)
            metrics.dead_letters = RefusalCounts()
            self.participants.undo(epoch, begun, handles, log)
            known = self.decisions.same_stream(winner, self.source)
            yield from self._finish(winner, metrics)
            self.replay.compare(winner, record.content, self.totals, log, stream_known=known)
            return self._result(EpochOutcome.ALREADY_COMMITTED, winner, metrics)
        if self._phase2.enabled:
            self.decisions.look_ahead(epoch + 1, metrics, log)
            self._phase2.begin(record, lambda: self._finish_in_background(record))
        else:
            yield from self._finish(record, metrics)
            self._expire(epoch, metrics, log)
        return self._committed(EpochOutcome.COMMITTED, record, metrics, log)

    def distributed_epoch_steps(
        self, epoch: int, prepare: Callable[[int], Sequence[CommitHandle]]
    ) -> Steps[EpochResult]:
        generation = self._started(epoch)
        if not self.executor_mode:
            raise UsageError(
                "distributed epochs need a coordinator made with executor_mode=True",
                job=self.job_id,
                epoch=epoch,
            )
        log = self.log.bind(epoch=epoch)
        metrics = EpochMetrics(epoch, watch=self.watch)
        yield "epoch-start"
        yield from self._phase2.settled(metrics, self._finish, reaching=epoch)
        self.streams.at_epoch(epoch, self.source, log)
        self.lost_epochs.at_epoch(epoch)
        decided = self.decisions.lookup(epoch, metrics)
        if decided is not None:
            known = self.decisions.same_stream(decided, self.source)
            log.info("already decided by generation %d: finishing it", decided.generation)
            yield from self._finish(decided, metrics)
            yield from self.participants.discard_losers(decided, generation, metrics, log)
            self.totals.epochs_skipped += 1
            if not known:
                raise unproven_replay(self.job_id, decided, EXECUTOR_MODE_ROWS)
            return self._result(EpochOutcome.ALREADY_COMMITTED, decided, metrics)
        order = {s.name: i for i, s in enumerate(self.sinks)}

        def undo() -> None:
            for _ in self.participants.discard_losers(None, generation, metrics, log):
                pass

        with self._undone_on_failure(epoch, log, undo):
            with metrics.phase("write"):
                handles = list(prepare(generation))
            for handle in handles:
                require_part_of(self.job_id, epoch, handle, order)
                metrics.rows[handle.sink] = metrics.rows.get(handle.sink, 0) + handle.rows
                metrics.bytes[handle.sink] = metrics.bytes.get(handle.sink, 0) + handle.bytes
            metrics.batches = len(handles)
            yield "after-prepare"
            handles.sort(key=lambda h: (order[h.sink], h.participant))
            record = self._record(epoch, generation, handles)
            yield from self._phase2.settled(metrics, self._finish)
            self.participants.check(self.sinks, epoch, handles)
            with metrics.phase("decision"), self.watch.calling("decision store", "put"):
                winner = self.store.put(record)
        yield "after-decision"
        if winner != record:
            log.info("generation %d decided this epoch first: yielding to it", winner.generation)
            if not self.decisions.same_stream(winner, self.source):
                yield from self._finish(winner, metrics)
                yield from self.participants.discard_losers(winner, generation, metrics, log)
                raise unproven_replay(self.job_id, winner, EXECUTOR_MODE_ROWS)
            record = winner
        late = self._late_decisions(epoch, metrics)
        if self._phase2.enabled:
            self.decisions.look_ahead(epoch + 1, metrics, log)
            self._phase2.begin(record, lambda: self._finish_in_background(record, generation, late))
        else:
            yield from self._finish(record, metrics)
            yield from self.participants.discard_losers(record, generation, metrics, log)
            self._sweep_late_attempts(late, generation, metrics, log)
            self._expire(epoch, metrics, log)
        self._decided[epoch] = record
        self._decided.pop(epoch - LATE_SWEEP_EPOCHS - 1, None)
        if self._first_distributed is None:
            self._first_distributed = epoch
        outcome = (
            EpochOutcome.COMMITTED
            if record.generation == generation
            else EpochOutcome.ALREADY_COMMITTED
        )
        return self._committed(outcome, record, metrics, log)

    def _late_decisions(
        self, epoch: int, metrics: EpochMetrics
    ) -> list[tuple[int, DecisionRecord]]:
        """The epochs whose late attempts are rolled back after `epoch`
        (`_sweep_late_attempts`), with their decisions: the one before (late attempts are
        usually that recent) and the one LATE_SWEEP_EPOCHS back (an attempt that lingered,
        and whatever the first sweep raced with). The decision of each is this coordinator's
        own, kept in memory; only in the first LATE_SWEEP_EPOCHS epochs after a start is the
        far one read from the store (the previous run's last epochs)."""
        found = []
        for back in (epoch - 1, epoch - LATE_SWEEP_EPOCHS):
            record = self._decided.get(back)
            first = self._first_distributed
            before_this_run = first is None or back < first
            if record is None and 0 <= back == epoch - LATE_SWEEP_EPOCHS and before_this_run:
                with metrics.phase("lookup"):
                    record = self.decisions.for_epoch(back)
            if record is not None:
                found.append((back, record))
        return found

    def _sweep_late_attempts(
        self,
        late: Sequence[tuple[int, DecisionRecord]],
        generation: int,
        metrics: EpochMetrics,
        log: JobLogger,
    ) -> None:
        """Roll back the attempts of the `late` epochs (`_late_decisions`) that prepared (or
        began) after their epoch's decision and its discard of losers (a late or speculative
        task, one killed while it wrote), instead of leaving them, with their locks, slots,
        open uploads and journal entries, to the next start's recovery. The cost per epoch
        stays the same however long the job runs; anything later still is recovery's."""
        for back, record in late:
            for _ in self.participants.discard_losers(record, generation, metrics, log, back):
                pass

    def _at_least_once_steps(
        self, epoch: int, batches: Iterable[pa.RecordBatch]
    ) -> Steps[EpochResult]:
        """At-least-once: each sink commits the epoch on its own, in one transaction where it
        can (a LastResource commits with its marker, no prepare), with no decision across
        sinks. A replay skips the sinks whose marker shows the epoch; a crash between two
        sinks' commits leaves the epoch in some sinks only until Spark replays it."""
        generation = self._started(epoch)
        log = self.log.bind(epoch=epoch)
        metrics = EpochMetrics(epoch, watch=self.watch)
        yield "epoch-start"
        with metrics.phase("lookup"):
            todo = []
            for sink in self.sinks:
                landed = sink.last_committed_epoch()
                if landed is None or landed < epoch:
                    todo.append(sink)
        # The dead letters commit first: a crash after them and before a target's commit
        # replays the epoch into that target, whose refusals are then already in the dead
        # letter (at least once); the other order could lose them.
        lazy = self.dead_letter if self.dead_letter in todo else None
        targets = [s for s in todo if s is not self.dead_letter]
        letters = self._letters(epoch)
        begun: list[SinkConnector] = []
        handles: dict[str, CommitHandle] = {}
        with self._undone_on_failure(
            epoch, log, lambda: self.participants.undo(epoch, begun, handles, log), decides=False
        ):
            with metrics.phase("begin"):
                for sink in targets:
                    with self.participants.calling(sink, "begin_epoch"):
                        sink.begin_epoch(epoch)
                    begun.append(sink)
            if targets:
                yield from self.participants.write(epoch, targets, batches, metrics, letters)
            yield from self._write_dead_letters(epoch, letters, lazy, begun, metrics)
            for sink in begun:
                with metrics.phase("pre_commit"), self.participants.calling(sink, "pre_commit"):
                    handles[sink.name] = sink.pre_commit(epoch)
        committing = sorted(begun, key=lambda s: s is not self.dead_letter)
        record = self._record(epoch, generation, [handles[s.name] for s in committing], metrics)
        for sink in committing:
            handle = handles[sink.name]
            with metrics.phase("commit"):
                if isinstance(sink, LastResource):
                    with self.participants.calling(sink, "commit_with_decision"):
                        sink.commit_with_decision(epoch, handle, record.to_json())
                else:
                    self.participants.commit(sink, [handle])
                    self.participants.publish(sink, record)
            yield f"after-commit:{sink.name}"
        self.expiry.after(epoch, metrics, log)
        self._count_committed(metrics)
        outcome = EpochOutcome.COMMITTED if targets else EpochOutcome.ALREADY_COMMITTED
        return self._result(outcome, record, metrics)

    # -- shared by the epoch procedures --------------------------------------------------------
    def _letters(self, epoch: int) -> DeadLetterPass:
        return DeadLetterPass(
            self.job_id, epoch, self.bad_row_cap, isolating=self.dead_letter is not None
        )

    def _write_dead_letters(
        self,
        epoch: int,
        letters: DeadLetterPass,
        lazy: SinkConnector | None,
        begun: list[SinkConnector],
        metrics: EpochMetrics,
    ) -> Steps[None]:
        """After the write pass: check the cap (TooManyBadRowsError), then write the pass's
        dead letters into the dead-letter sink, beginning it first when it takes part only
        in epochs that have some (`lazy`)."""
        letters.check_cap()
        dead_letter = self.dead_letter
        if dead_letter is None or (lazy is None and dead_letter not in begun):
            return  # no dead-letter sink, or (at least once) it holds the epoch already
        batch = letters.batch()
        if batch is None:
            return
        if lazy is not None:
            with metrics.phase("begin"), self.participants.calling(lazy, "begin_epoch"):
                lazy.begin_epoch(epoch)
                begun.append(lazy)
            yield f"after-begin:{lazy.name}"
        with metrics.phase("write"), self.participants.calling(dead_letter, "write_batch"):
            result = write_dead_letters(dead_letter, batch, self.job_id, epoch)
        metrics.rows[dead_letter.name] = metrics.rows.get(dead_letter.name, 0) + result.rows
        metrics.bytes[dead_letter.name] = metrics.bytes.get(dead_letter.name, 0) + result.bytes
        metrics.dead_letters = letters.counts
        yield f"after-write:dead-letters:{dead_letter.name}"

    def _record(
        self,
        epoch: int,
        generation: int,
        handles: Sequence[CommitHandle],
        metrics: EpochMetrics | None = None,
    ) -> DecisionRecord:
        return DecisionRecord(
            self.job_id,
            epoch,
            generation,
            tuple(handles),
            source=self.source,
            first_epoch=self.streams.first_epoch,
            dead_letters={} if metrics is None else metrics.dead_letters.by_sink,
        )

    def _finish(self, decision: DecisionRecord, metrics: EpochMetrics) -> Steps[None]:
        """Commit every participant of a decided epoch (idempotent), then mark it finished.
        The last resource's participant committed with the decision itself."""
        yield from self.participants.commit_decided(
            decision, metrics, skip=self.decisions.last, finished=lambda: self._finished(decision)
        )
        if self.decisions.store_holds_decisions:
            with metrics.phase("finish"), self.watch.calling("decision store", "mark_finished"):
                self.store.mark_finished(decision.epoch)
        yield "after-finish"

    def _finish_in_background(
        self,
        decision: DecisionRecord,
        generation: int | None = None,
        late: Sequence[tuple[int, DecisionRecord]] = (),
    ) -> None:
        """`_finish`, in executor mode the rollback of the epoch's losing attempts of
        `generation` or older and of the `late` epochs' late attempts, and the expiry of old
        decisions and markers, as the epoch itself would have run them after its decision (in
        the background thread of `_phase2`; the sweep of this epoch's own late attempts
        comes with the next epoch's)."""
        metrics = EpochMetrics(decision.epoch)
        log = self.log.bind(epoch=decision.epoch)
        for _ in self._finish(decision, metrics):
            pass
        if generation is not None:
            for _ in self.participants.discard_losers(decision, generation, metrics, log):
                pass
            self._sweep_late_attempts(late, generation, metrics, log)
        self._expire(decision.epoch, metrics, log)
        log.debug("phase 2 finished in the background in %.1f ms", metrics.seconds["commit"] * 1e3)

    def _expire(self, epoch: int, metrics: EpochMetrics, log: JobLogger) -> None:
        """After `epoch` committed everywhere: drop the decisions and the sinks' records
        beyond `retain_epochs` (house-keeping: failures are logged, never raised)."""
        self.decisions.expire(epoch, self.retain_epochs, metrics, log)
        self.expiry.after(epoch, metrics, log)

    def _commits_beside_writes(self, last: LastResource | None) -> bool:
        """Whether every sink whose commit is phase 2 (all but the one whose commit is the
        decision) can commit beside its next epoch's writes; logged when not."""
        unable = [
            sink.name
            for sink in self.sinks
            if sink is not last and not sink.capabilities().commits_beside_writes
        ]
        if unable:
            self.log.warning(
                "background_commits is off for this job: sink(s) %s cannot commit an epoch "
                "while writing the next; each epoch commits before its batch returns",
                ", ".join(unable),
            )
        return not unable

    def _finished(self, decision: DecisionRecord) -> bool:
        """Whether every participant of the decided epoch is known committed: the store
        marked it finished (also a store that holds no decisions now: the job may have been
        two-phase when it decided the epoch), or the commit point's own commit was the whole
        epoch."""
        last = self.decisions.last
        if last is not None and all(h.sink == last.name for h in decision.handles):
            return True
        return self.store.is_finished(decision.epoch)

    def _count_committed(self, metrics: EpochMetrics) -> None:
        for sink, reasons in metrics.dead_letters.by_sink.items():
            self.totals.dead_letters.add(sink, reasons)
        self.totals.epochs_committed += 1
        self.totals.rows += sum(metrics.rows.values())
        self.totals.bytes += sum(metrics.bytes.values())

    def _committed(
        self,
        outcome: EpochOutcome,
        record: DecisionRecord,
        metrics: EpochMetrics,
        log: JobLogger,
    ) -> EpochResult:
        self._count_committed(metrics)
        log.info(
            "committed %d rows in %d participants of %d batches (protocol %.1f ms)%s",
            sum(h.rows for h in record.handles),
            len(record.handles),
            metrics.batches,
            metrics.protocol_seconds * 1e3,
            _dead_letter_note(metrics),
        )
        return self._result(outcome, record, metrics)

    def _result(
        self, outcome: EpochOutcome, decision: DecisionRecord, metrics: EpochMetrics
    ) -> EpochResult:
        self.last_metrics = metrics
        return EpochResult(decision.epoch, outcome, decision, metrics)


def _dead_letter_note(metrics: EpochMetrics) -> str:
    """ "; dead letters: 3 (events: not_null 2, unique 1)" for the per-epoch log line."""
    counts = metrics.dead_letters
    if not counts:
        return ""
    per_sink = "; ".join(
        f"{sink}: " + ", ".join(f"{reason} {n}" for reason, n in sorted(reasons.items()))
        for sink, reasons in sorted(counts.by_sink.items())
    )
    return f"; dead letters: {counts.total()} ({per_sink})"
