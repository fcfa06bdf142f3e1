"""Committed epochs a target lost: the checks made when a coordinator starts and at the first
epoch of its run.

A failover to an asynchronous standby, a restore from a backup or rows deleted behind the
job can take away the newest epochs a target committed: rows and marker rows, a prepared
transaction whose decision said commit, or (when the decision store lives on the same
server) the decisions too. Recovery then finds nothing to commit, Spark's checkpoint says
the batches are done, and a job without these checks would go on with the rows missing.

What is checked (at most a few reads per start, none per epoch after the first):

- at start, after recovery: the job's newest decided epoch D (the store's newest record,
  or the newest epoch the commit point's sink holds when that sink carries decisions). Every
  sink D wrote rows into (named in D's record) must hold D once D is finished; while D is
  decided but not finished (its replay finishes it, and its commit of a lost participant
  raises ParticipantLostError), the same holds for D - 1. No sink may hold an epoch newer
  than D: its decisions were lost.
- at the first epoch E of the run: E <= D + 1. Spark calls the writer for every batch,
  empty ones too, and every epoch the coordinator runs is decided, so a larger E means
  Spark's checkpoint committed batches D+1 .. E-1 that the job has no decision for (e.g. a
  one-phase Postgres sink, whose decisions are its marker rows, lost them with its rows).

A sink that shows no committed epoch at all, though D's record names it with rows, lost
everything the job committed into it (its table dropped and created again, its folder,
prefix or Delta table deleted, a restore from a backup older than the job) when its target
keeps its commit record (core.protocol.KeepsCommitRecord); a sink that cannot say so (a
Delta table whose transaction identifiers expire, a sink not built in) is skipped, logged.

Never checked, because nothing there is wrong: a job with no decision yet (a fresh job, or
one whose store was replaced: EpochOrderError at its first epoch names that), at least once
(no decisions), a start without recovery (a look at a running job: epochs may be in flight),
a sink D's record does not name (the dead-letter sink joins only epochs with dead
letters) or names with no rows (a target may record no commit of an empty epoch: a Delta
merge of no rows makes no table version). Older decisions expire (`retain_epochs`), never
the newest, so D is always known. A loss of older epochs only (never the newest, e.g. rows
deleted by hand) is not seen here.
"""

from __future__ import annotations

from collections.abc import Sequence

from durable_sinks.core.errors import (
    LOST_EPOCHS_CAUSES,
    LOST_EPOCHS_DOC,
    CommittedEpochLostError,
)
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.protocol import KeepsCommitRecord, RereadsCommitted, SinkConnector

from ._decisions import DecisionBook

#: The holder of a loss of decisions (rather than of a sink's rows).
STORE = "decision store"


def _epochs(first: int, last: int) -> str:
    return f"epoch {first}" if first == last else f"epochs {first}..{last}"


def _fix(holder: str, first: int, last: int) -> str:
    return (
        f"stop the job and repair {_epochs(first, last)} of {holder} before restarting: copy "
        "them from the old server's data if it still exists (for Postgres, `durable-sinks "
        "repair-epochs`), or re-supply their rows from the source and record the loss "
        f"(`durable-sinks repair-epochs --record-loss`); see {LOST_EPOCHS_DOC}. Restarting "
        "without a repair fails the same way, never writes over the gap"
    )


def _held(sink: SinkConnector, newest: int) -> int | None:
    """The sink's highest committed epoch; read from the target again when it looks short of
    `newest`: what it read at open may predate a zombie driver finishing `newest` there."""
    held = sink.last_committed_epoch()
    if (held is None or held < newest) and isinstance(sink, RereadsCommitted):
        held = sink.reread_last_committed_epoch()
    return held


class LostEpochCheck:
    """The lost-epoch checks of one coordinator run (module docstring). `at_start` once,
    after recovery; `at_epoch` before each epoch (it checks only the first)."""

    def __init__(
        self, job_id: str, decisions: DecisionBook, sinks: Sequence[SinkConnector]
    ) -> None:
        self.job_id = job_id
        self.decisions = decisions
        self.sinks = sinks
        #: The newest decided epoch found at start (None: none, or not checked).
        self.newest: int | None = None
        self._first_pending = False

    def at_start(self, log: JobLogger) -> None:
        """CommittedEpochLostError when a sink lacks the newest finished epoch it took part
        in, or holds an epoch newer than every decision; arms the first-epoch check."""
        newest = self.decisions.newest_at_start()
        self.newest = newest
        if newest is None:
            return
        self._first_pending = True
        self._require_decisions_for_held(newest)
        self._require_held(newest, log)
        log.info("lost-epoch check passed (the newest decided epoch is %d)", newest)

    def _require_decisions_for_held(self, newest: int) -> None:
        for sink in self.sinks:
            held = sink.last_committed_epoch()
            if held is None or held <= newest:
                continue
            holder = STORE if self.decisions.last is None else self.decisions.last.name
            raise CommittedEpochLostError(
                f"sink {sink.name!r} holds epoch {held}, but the newest decision the job has "
                f"is for epoch {newest}: {holder} lost the decisions of "
                f"{_epochs(newest + 1, held)} (likely cause: {LOST_EPOCHS_CAUSES}, on the "
                "server that keeps them)",
                first_lost=newest + 1,
                last_lost=held,
                holder=holder,
                job=self.job_id,
                sink=sink.name,
                fix=_fix(holder, newest + 1, held),
            )

    def _newest_finished(self, newest: int) -> int | None:
        """D, or D - 1 when D is decided but not finished (its replay finishes it, and a
        lost participant fails that commit); None when neither is known to be finished.
        Only the newest epoch can be unfinished: Spark replays it before the next one."""
        book = self.decisions
        if not book.store_holds_decisions:
            return newest  # the commit point's own commit is the decision: finished
        for epoch in (newest, newest - 1):
            if epoch >= 0 and book.store.is_finished(epoch):
                return epoch
        return None

    def _require_held(self, newest: int, log: JobLogger) -> None:
        finished = self._newest_finished(newest)
        if finished is None:
            return
        newest = finished
        record = self.decisions.decision(newest)
        if record is None:
            return
        by_name = {sink.name: sink for sink in self.sinks}
        # Only sinks the epoch wrote rows into: some targets record no commit of an epoch
        # that gave them none (a Delta merge of no rows makes no table version).
        for name in sorted({handle.sink for handle in record.handles if handle.rows > 0}):
            sink = by_name.get(name)
            if sink is None:
                continue
            held = _held(sink, newest)
            if held is None:
                self._require_record(sink, newest, log)
                continue
            if held >= newest:
                continue
            raise CommittedEpochLostError(
                f"sink {name!r} holds epochs up to {held} only, but the job committed epoch "
                f"{newest} into it: {_epochs(held + 1, newest)} of the sink are lost (rows "
                f"and marker rows, or their prepared transactions; likely cause: "
                f"{LOST_EPOCHS_CAUSES}). Epochs between that did not involve the sink are "
                "not lost",
                first_lost=held + 1,
                last_lost=newest,
                holder=name,
                job=self.job_id,
                sink=name,
                fix=_fix(f"sink {name!r}", held + 1, newest),
            )

    def _require_record(self, sink: SinkConnector, newest: int, log: JobLogger) -> None:
        """A sink the job committed `newest` into shows no committed epoch: a loss of
        everything, when its target keeps its commit record; otherwise nothing can tell."""
        if not (isinstance(sink, KeepsCommitRecord) and sink.commit_record_kept()):
            log.info(
                "sink %r shows no committed epoch, and its target may drop its commit record "
                "(core.protocol.KeepsCommitRecord): whether it still holds epoch %d is not "
                "checked",
                sink.name,
                newest,
            )
            return
        raise CommittedEpochLostError(
            f"sink {sink.name!r} shows no committed epoch at all, but the job committed "
            f"epoch {newest} into it: its target lost every epoch the job committed there "
            "(emptied, dropped and created again, moved, or restored from a backup older than "
            "the job)",
            first_lost=0,
            last_lost=newest,
            holder=sink.name,
            job=self.job_id,
            sink=sink.name,
            fix=_fix(f"sink {sink.name!r}", 0, newest)
            + "; if the target was emptied on purpose, run the query under a new job_id",
        )

    def at_epoch(self, epoch: int) -> None:
        """At the run's first epoch: CommittedEpochLostError when Spark's checkpoint skipped
        past the newest decision (module docstring), raised again for every epoch asked
        until one passes; epochs after that are not checked."""
        if not self._first_pending:
            return
        newest = self.newest
        if newest is None or epoch <= newest + 1:
            self._first_pending = False
            return
        last = self.decisions.last
        holder = STORE if last is None else f"sink {last.name!r}"
        raise CommittedEpochLostError(
            f"Spark asks for epoch {epoch}, so its checkpoint has committed "
            f"{_epochs(newest + 1, epoch - 1)}, but the job's newest decision is for epoch "
            f"{newest}: {holder} lost {_epochs(newest + 1, epoch - 1)} with their decisions "
            f"(likely cause: {LOST_EPOCHS_CAUSES}; or the query ran those batches with "
            "another writer)",
            first_lost=newest + 1,
            last_lost=epoch - 1,
            holder=STORE if last is None else last.name,
            job=self.job_id,
            sink=None if last is None else last.name,
            epoch=epoch,
            fix=_fix(holder, newest + 1, epoch - 1),
        )
