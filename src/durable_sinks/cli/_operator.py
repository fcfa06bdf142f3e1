"""The logic behind `durable-sinks status|inspect|resolve|verify|expire|repair-epochs|drop`:
a job's decision store and sinks opened read only (`OpenContext(inspect=True)`,
`DecisionStore.peek`), and what they say put side by side. Nothing here claims a generation
or writes, except `resolve` (which starts a coordinator: the same recovery a restarted job
runs), `expire`, and `repair-epochs` and `drop` with `--apply`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from durable_sinks.coordinator import RecoveryReport, validate
from durable_sinks.core import LastResource, OpenContext, SinkConnector
from durable_sinks.core.errors import ConfigError, DropRefusedError
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.operations import (
    Bookkeeping,
    DroppableSink,
    EpochRepair,
    ExpiringSink,
    Holding,
    OperableSink,
    Prepared,
    RepairableSink,
)
from durable_sinks.core.protocol import CommitHandle
from durable_sinks.manifest import DecisionRecord, DecisionStore, DroppableStore
from durable_sinks.spark._build import build_coordinator, close_quietly, decision_store
from durable_sinks.spark._options import JobOptions
from durable_sinks.spark._specs import SinkSpec

#: A coordinator counts as running when its generation decided an epoch this recently.
DEFAULT_LIVE_WINDOW_S = 120.0
#: Above every epoch a sink can hold (the S3 sink's 12-digit epoch folders).
MAX_EPOCH = 10**12 - 1
#: How far above an epoch `verify` looks for a kept decision, to tell an expired one.
EXPIRY_LOOKAHEAD = 1_000
#: How many of the latest decided epochs `drop` checks are committed on every sink (a
#: coordinator finishes each epoch before it begins the next: only the newest can be open).
UNFINISHED_LOOKBACK = 100
#: The target name `drop` shows for the decision store.
STORE = "decision store"
#: What `drop` says of a sink or store that cannot drop a job itself.
BY_HAND = (
    "not droppable: remove by hand what it keeps of job {job} (its markers, fence or "
    "generation records, decisions, staging leftovers: see its kind's documentation)"
)


@dataclass(frozen=True)
class Dropping:
    """One kind of bookkeeping of the job on one target (a sink's name, or STORE)."""

    target: str
    item: Bookkeeping


@dataclass
class DropPlan:
    """What `drop` found (or, applied, removed), what stays and why, and the targets that
    cannot drop a job themselves, each with what to remove by hand."""

    found: list[Dropping] = field(default_factory=list)
    by_hand: list[tuple[str, str]] = field(default_factory=list)

    @property
    def removable(self) -> list[Dropping]:
        return [d for d in self.found if d.item.removable]

    @property
    def kept(self) -> list[Dropping]:
        return [d for d in self.found if not d.item.removable]


@dataclass(frozen=True)
class SinkStatus:
    name: str
    kind: str
    last_committed: int | None
    at: float | None
    in_doubt: int | None


@dataclass(frozen=True)
class Status:
    job: str
    store: str
    generation: int
    live: str | None
    latest_decision: int | None
    decided_at: float | None
    sinks: list[SinkStatus]
    in_flight: list[int]
    #: The stream of the latest decision (a Spark query id; None: not named) and the epoch of
    #: that stream's first batch (a query moved to a new checkpoint starts after it).
    stream: str | None = None
    first_epoch: int | None = None


@dataclass(frozen=True)
class Doubt:
    """One prepared participant and what governs it."""

    sink: str
    prepared: Prepared
    generation: int | None
    decision: DecisionRecord | None
    commits: bool

    @property
    def action(self) -> str:
        return "commit" if self.commits else "roll back"

    @property
    def governed_by(self) -> str:
        if self.decision is None:
            return "none: presumed abort"
        g = self.decision.generation
        if self.commits:
            return f"decided by generation {g}: commit"
        return f"epoch decided by generation {g} without it: roll back"


@dataclass(frozen=True)
class Check:
    """One epoch of one sink in `verify`."""

    epoch: int
    sink: str
    decided: str
    held: str
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class Verdict:
    first: int | None
    last: int | None
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


class Operator:
    """A job's store and sinks, opened read only. Use as a context manager."""

    def __init__(self, specs: Sequence[SinkSpec], options: JobOptions) -> None:
        dead_letter = [options.dead_letter] if options.dead_letter is not None else []
        #: The job's targets (its dead-letter sink, if any, is in `options`).
        self.specs = list(specs)
        self.options = options
        self.job = options.job_id
        self.store: DecisionStore = decision_store(self.specs, options)
        #: Every sink of the job, opened: the targets, then the dead-letter sink.
        self.sinks: list[SinkConnector] = []
        self.kinds = {s.name: s.kind for s in [*self.specs, *dead_letter]}
        try:
            self.generation = self.store.peek_generation(self.job)
            built = [s.build() for s in [*self.specs, *dead_letter]]
            self.commit_point = validate(
                self.job,
                built,
                self.store,
                options.guarantee,
                executor_mode=options.execution == "executor",
                one_phase=options.one_phase,
                dead_letter=built[-1] if dead_letter else None,
                policy=options.write_policy,
            )
            for sink in built:
                sink.open(OpenContext(self.job, sink.name, self.generation, inspect=True))
                self.sinks.append(sink)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Operator:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.store.close()

    # -- decisions -----------------------------------------------------------------------------
    def decision(self, epoch: int) -> DecisionRecord | None:
        """The epoch's decision: the store's record, or the one the commit point's commit
        carried (one-phase Postgres, Kafka as last resource)."""
        found = self.store.peek(self.job, epoch)
        if found is not None or not isinstance(self.commit_point, LastResource):
            return found
        carried = self.commit_point.read_decision(epoch)
        if carried is None:
            return None
        return DecisionRecord.from_json(carried, source=f"{self.commit_point.name} commit")

    def latest_decision(self) -> int | None:
        latest = self.store.peek_latest(self.job)
        if self.commit_point is not None:
            landed = self.commit_point.last_committed_epoch()
            if landed is not None and (latest is None or landed > latest):
                latest = landed
        return latest

    def live(self, window_s: float = DEFAULT_LIVE_WINDOW_S) -> str | None:
        """Why a coordinator of the job's newest generation looks alive, or None: a sink holds
        a session of that generation, or that generation decided an epoch within `window_s`."""
        return self._live(window_s, *self._newest())

    def _newest(self) -> tuple[int | None, DecisionRecord | None]:
        """The latest decided epoch and its decision (read once per command: with Kafka as the
        commit point, both scan the progress topic)."""
        latest = self.latest_decision()
        return latest, self.decision(latest) if latest is not None else None

    def _live(
        self, window_s: float, latest: int | None, decision: DecisionRecord | None
    ) -> str | None:
        for sink in self.sinks:
            if isinstance(sink, OperableSink) and self.generation in sink.live_generations():
                return f"{sink.name} has sessions of generation {self.generation}"
        if decision is not None and decision.generation == self.generation:
            age = time.time() - decision.created_at
            if age < window_s:
                return f"generation {self.generation} decided epoch {latest} {age:.0f} s ago"
        return None

    # -- status and inspect --------------------------------------------------------------------
    def status(self) -> Status:
        sinks, in_flight = [], set()
        for sink in self.sinks:
            last = sink.last_committed_epoch()
            at, doubts = None, None
            if isinstance(sink, OperableSink):
                if last is not None:
                    held = sink.holdings(last, last).get(last)
                    at = held.at if held is not None else None
                prepared = sink.in_doubt()
                doubts = len(prepared)
                in_flight |= {p.handle.epoch for p in prepared}
            sinks.append(SinkStatus(sink.name, self.kinds[sink.name], last, at, doubts))
        latest, decision = self._newest()
        return Status(
            self.job,
            repr(self.store),
            self.generation,
            self._live(DEFAULT_LIVE_WINDOW_S, latest, decision),
            latest,
            decision.created_at if decision is not None else None,
            sinks,
            sorted(in_flight),
            None if decision is None else decision.source,
            None if decision is None else decision.first_epoch,
        )

    def inspect(self) -> list[Doubt]:
        doubts = []
        decisions: dict[int, DecisionRecord | None] = {}
        for sink in self.sinks:
            if not isinstance(sink, OperableSink):
                continue
            for prepared in sink.in_doubt():
                epoch = prepared.handle.epoch
                if epoch not in decisions:
                    decisions[epoch] = self.decision(epoch)
                decision = decisions[epoch]
                name = ParticipantName.parse(prepared.handle.participant)
                doubts.append(
                    Doubt(
                        sink.name,
                        prepared,
                        name.generation if name is not None else None,
                        decision,
                        decision is not None and decision.commits(prepared.handle),
                    )
                )
        return doubts

    def dead_letters(self, epochs: int) -> list[tuple[int, str, str, int]]:
        """(epoch, sink, reason, rows) for every dead letter the latest `epochs` decided
        epochs committed, newest first (read from their decisions)."""
        latest = self.latest_decision()
        found = []
        for epoch in range(latest, max(latest - epochs, -1), -1) if latest is not None else ():
            decision = self.decision(epoch)
            if decision is None:
                continue
            for sink, reasons in sorted(decision.dead_letters.items()):
                for reason, n in sorted(reasons.items()):
                    found.append((epoch, sink, reason, n))
        return found

    def not_inspectable(self) -> list[str]:
        return [s.name for s in self.sinks if not isinstance(s, OperableSink)]

    # -- verify --------------------------------------------------------------------------------
    def verify(self, first: int | None, last: int | None) -> Verdict:
        """Per epoch in `first..last` (default: every epoch a sink holds or the store
        decided), the decision against each sink's markers and data."""
        top = last if last is not None else self.latest_decision()
        high = top if top is not None else MAX_EPOCH
        held: dict[str, dict[int, Holding]] = {}
        for sink in self.sinks:
            if isinstance(sink, OperableSink):
                held[sink.name] = sink.holdings(first or 0, high)
        epochs = {e for h in held.values() for e in h}
        if top is not None:
            epochs |= set(range(first if first is not None else min(epochs | {top}), top + 1))
        verdict = Verdict(min(epochs, default=None), max(epochs, default=None))
        kept = None  # an epoch with a kept decision above the epochs checked so far
        for epoch in sorted(epochs):
            decision = self.decision(epoch)
            expired = False
            if decision is None:
                if not any(epoch in h for h in held.values()):
                    continue  # undecided and nowhere: nothing to check
                if kept is None or epoch >= kept:
                    kept = self._kept_above(epoch)
                expired = kept is not None
            for sink in self.sinks:
                check = self._check(epoch, sink, decision, held.get(sink.name), expired)
                verdict.checks.append(check)
        return verdict

    def _check(
        self,
        epoch: int,
        sink: SinkConnector,
        decision: DecisionRecord | None,
        held: dict[int, Holding] | None,
        expired: bool,
    ) -> Check:
        """`expired`: the epoch has no decision because it expired (a later one is kept)."""
        if held is None:
            return Check(epoch, sink.name, "-", "not inspectable", ())
        holding = held.get(epoch)
        shown = _held(holding)
        if decision is None:
            if holding is None:
                return Check(epoch, sink.name, "none", shown, ())
            problems: tuple[str, ...] = ("the sink holds data of the epoch but no decision exists",)
            if expired:
                problems = ()
                shown += " (decision expired)"
            return Check(epoch, sink.name, "none", shown, problems + holding.problems)
        handles = decision.handles_for(sink.name)
        if not handles and holding is None:
            # not a participant of the epoch (the dead-letter sink of an epoch without any)
            return Check(epoch, sink.name, "no participant", shown, ())
        rows = sum(h.rows for h in handles)
        decided = f"{rows} rows, {len(handles)} part{'s' if len(handles) != 1 else ''}"
        if holding is None and isinstance(sink, ExpiringSink) and epoch < min(held, default=0):
            return Check(epoch, sink.name, decided, "marker expired", ())
        if holding is None or not holding.marker:
            problem = "decided, but the sink shows no marker (not committed: run resolve)"
            extra = holding.problems if holding is not None else ()
            return Check(epoch, sink.name, decided, shown, (problem, *extra))
        found = list(holding.problems)
        expected = {h.participant for h in handles}
        if holding.participants != expected:
            found.append(
                f"the markers name {sorted(holding.participants)}, the decision {sorted(expected)}"
            )
        if holding.rows is not None and holding.rows != rows:
            what = "holds" if holding.counted else "markers record"
            found.append(f"the sink {what} {holding.rows} rows, the decision {rows}")
        return Check(epoch, sink.name, decided, shown, tuple(found))

    def _kept_above(self, epoch: int) -> int | None:
        """The first epoch above `epoch` (within EXPIRY_LOOKAHEAD) whose decision the store
        still keeps: `epoch`'s decision expired if there is one. None if there is none."""
        return next(
            (e for e in range(epoch + 1, epoch + EXPIRY_LOOKAHEAD) if self.store.peek(self.job, e)),
            None,
        )

    # -- resolve and expire --------------------------------------------------------------------
    def resolve(self) -> RecoveryReport:
        """Claim a new generation (fencing every older coordinator) and resolve every
        leftover by the recovery table: exactly what a restarted job's start does."""
        coordinator = build_coordinator(self.specs, self.options)
        try:
            return coordinator.start()
        finally:
            close_quietly(coordinator)

    def expire(self, keep: int) -> dict[str, int]:
        """Delete the markers of epochs more than `keep` behind each sink's last committed
        one (never the newest); the number deleted per sink (-1: the sink keeps none)."""
        deleted = {}
        for sink in self.sinks:
            last = sink.last_committed_epoch()
            if not isinstance(sink, ExpiringSink):
                deleted[sink.name] = -1
            elif last is None:
                deleted[sink.name] = 0
            else:
                deleted[sink.name] = sink.expire_markers(last - keep + 1)
        return deleted

    # -- drop ----------------------------------------------------------------------------------
    def unfinished(self) -> list[tuple[int, str]]:
        """(epoch, sink) for each of the latest UNFINISHED_LOOKBACK decided epochs whose
        decision names a participant of a sink that has not committed the epoch (the sink's
        last committed epoch is below it)."""
        latest = self.latest_decision()
        if latest is None:
            return []
        decisions: dict[int, DecisionRecord | None] = {}
        found = []
        for sink in self.sinks:
            last = sink.last_committed_epoch()
            start = max(-1 if last is None else last, latest - UNFINISHED_LOOKBACK) + 1
            for epoch in range(start, latest + 1):
                if epoch not in decisions:
                    decisions[epoch] = self.decision(epoch)
                decision = decisions[epoch]
                if decision is not None and decision.handles_for(sink.name):
                    found.append((epoch, sink.name))
        return sorted(found)

    def dropped(self, name: str) -> bool:
        """Whether sink `name` keeps nothing removable of the job any more: an earlier drop
        removed its bookkeeping (its markers with it), so an epoch it does not show
        committed is not one it is still committing."""
        sink = next(s for s in self.sinks if s.name == name)
        if not isinstance(sink, DroppableSink):
            return False
        return not any(item.removable for item in sink.drop_job(apply=False))

    def drop_refusal(
        self, live_window: float, *, apply: bool, force: bool
    ) -> DropRefusedError | None:
        """Why the job cannot be dropped now, or None: a prepared participant (any sink,
        any generation), a decided epoch not committed on every sink that still keeps
        bookkeeping of the job (a drop cut short after the sinks and before the store is
        finished by the next), or, for `apply` unless `force`, a coordinator of the job
        that looks alive (as `resolve` judges)."""
        fix = f"run `durable-sinks resolve {self.job} --apply` (with the job's options), then drop"
        doubts = self.inspect()
        if doubts:
            first = doubts[0]
            epoch = first.prepared.handle.epoch
            return DropRefusedError(
                f"job {self.job} is in doubt: {len(doubts)} prepared participant(s), the first "
                f"{first.prepared.handle.participant} of epoch {epoch} on sink {first.sink} "
                f"({first.governed_by}); dropping now would lose or strand it",
                job=self.job,
                sink=first.sink,
                epoch=epoch,
                fix=fix,
            )
        open_epochs = [(e, s) for e, s in self.unfinished() if not self.dropped(s)]
        if open_epochs:
            epoch, sink = open_epochs[0]
            return DropRefusedError(
                f"job {self.job} is in doubt: epoch {epoch} is decided but sink {sink} has not "
                "committed it yet",
                job=self.job,
                sink=sink,
                epoch=epoch,
                fix=fix,
            )
        live = None if force or not apply else self.live(live_window)
        if live:
            return DropRefusedError(
                f"a coordinator of job {self.job} seems to run ({live}); dropping its "
                "bookkeeping under it would break its exactly-once",
                job=self.job,
                fix="stop the query first, or give --force once sure it is stopped",
            )
        return None

    def drop(
        self, *, apply: bool, live_window: float, force: bool, epoch_markers: bool
    ) -> DropPlan:
        """What the job keeps in each sink and in its decision store; with `apply`, removed
        (the sinks first, the store last, so a drop cut short leaves the store's generation
        fencing any late coordinator, and a second drop finishes the rest). Raises
        DropRefusedError, removing nothing, while `drop_refusal` has a reason (in doubt: in
        a dry run too, which shows only what an applied drop could remove)."""
        refused = self.drop_refusal(live_window, apply=apply, force=force)
        if refused is not None:
            raise refused
        plan = DropPlan()
        for sink in self.sinks:
            if isinstance(sink, DroppableSink):
                found = sink.drop_job(apply=apply, epoch_markers=epoch_markers)
                plan.found += [Dropping(sink.name, item) for item in found]
            else:
                plan.by_hand.append((sink.name, BY_HAND.format(job=self.job)))
        if isinstance(self.store, DroppableStore):
            found = self.store.drop_job(self.job, apply=apply)
            plan.found += [Dropping(STORE, item) for item in found]
        else:
            plan.by_hand.append((f"{STORE} {self.store!r}", BY_HAND.format(job=self.job)))
        return plan

    def repairable(self, name: str) -> RepairableSink:
        """The job's sink `name`, if its kind can repair lost epochs; ConfigError otherwise."""
        found = next((s for s in self.sinks if s.name == name), None)
        if found is None:
            raise ConfigError(
                f"the job has no sink {name!r}",
                job=self.job,
                fix=f"name one of {[s.name for s in self.sinks]}",
            )
        if not isinstance(found, RepairableSink):
            raise ConfigError(
                f"sink {name!r} ({self.kinds[name]}) has no repair of lost epochs",
                job=self.job,
                sink=name,
                fix="re-supply the epochs' rows from the source (docs/reliability.md, "
                '"Lost committed epochs")',
            )
        return found

    def decided_commit(self, handle: CommitHandle) -> CommitHandle | None:
        """The decision's copy of `handle` when its epoch's decision commits it, else None."""
        decision = self.decision(handle.epoch)
        if decision is None or not decision.commits(handle):
            return None
        return decision.handle_of(handle)

    def copy_lost_epochs(self, name: str, source: str, *, apply: bool) -> list[EpochRepair]:
        """Sink `name`'s lost epochs, copied from its old target at `source`."""
        return self.repairable(name).copy_lost_epochs(source, self.decided_commit, apply=apply)

    def record_lost_epochs(
        self, name: str, through: int, note: str, *, apply: bool
    ) -> list[EpochRepair]:
        """Sink `name`'s epochs after its last committed one up to `through`, recorded lost."""
        return self.repairable(name).record_lost_epochs(through, note, apply=apply)


def _held(holding: Holding | None) -> str:
    if holding is None:
        return "nothing"
    marker = "marker" if holding.marker else "no marker"
    if holding.rows is None:
        return marker
    return f"{marker}, {holding.rows} rows {'counted' if holding.counted else 'in markers'}"
