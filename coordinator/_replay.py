"""The replay check: Spark replays a batch whose epoch is already decided, and the rows it
gives this time are compared with those the epoch committed.

A deterministic query replays the same rows (Spark re-runs the batch with the same offsets,
watermark and batch timestamp); different rows mean it is not deterministic (a source whose
data changed, current_timestamp(), rand() or uuid(), a join or limit whose result depends on
timing). The committed rows stay either way (exactly once means the first decision wins) but
the query's output is then not what a re-run would give, which the user should know.

The coordinator summarises an epoch's input while its batches stream through (driver mode,
core/content.py) and keeps the summary in the decision record. On a replay of a decided
epoch it finishes the epoch first (as always), then reads the replayed batches, summarises
them the same way and compares: a difference is logged at WARNING and counted in
`JobTotals.replay_mismatches` ("warn", the default) and, with "fail", raised as
ReplayMismatchError. "off" computes nothing and reads no replay.

Not checked: epochs whose decision has no summary (executor mode, where the rows never reach
the driver; at least once, which has no decision to compare with; records written before
the check existed or with "off"), and a replay that cannot be read (logged, not raised: the
epoch is committed whatever the replay holds).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from durable_sinks.core.content import ALGORITHM, ContentSummary, ContentTally
from durable_sinks.core.errors import ConfigError, EpochOrderError, ReplayMismatchError
from durable_sinks.core.joblog import JobLogger
from durable_sinks.manifest import DecisionRecord

from ._metrics import JobTotals
from ._participants import brief

if TYPE_CHECKING:
    import pyarrow as pa

ReplayCheckMode = Literal["warn", "fail", "off"]
REPLAY_CHECKS: tuple[ReplayCheckMode, ...] = ("warn", "fail", "off")

#: What a difference most likely means, for the warning and the error.
LIKELY_CAUSE = (
    "the query is not deterministic: a source whose data changed between the attempts (files "
    "rewritten, a table or an API read again), current_timestamp()/now(), rand()/uuid(), or a "
    "join, limit or aggregation whose result depends on timing or order"
)


class EpochTally:
    """Summarises an epoch's batches on their way to the sinks (`through`), then puts the
    summary in the epoch's decision record (`recorded`). With `tally` None (replay_check
    "off"): batches pass untouched, records stay without one."""

    def __init__(self, tally: ContentTally | None) -> None:
        self.tally = tally

    def through(self, batches: Iterable[Any]) -> Iterable[Any]:
        return batches if self.tally is None else self.tally.through(batches)

    def recorded(self, record: DecisionRecord) -> DecisionRecord:
        """`record` with the summary of every batch that went `through`."""
        if self.tally is None:
            return record
        return dataclasses.replace(record, content=self.tally.summary())


class ReplayCheck:
    """The replay check of one job, `mode` "warn", "fail" or "off" (ConfigError otherwise)."""

    def __init__(self, job_id: str, mode: str) -> None:
        if mode not in REPLAY_CHECKS:
            raise ConfigError(
                f"replay_check {mode!r} is not one of {list(REPLAY_CHECKS)}",
                job=job_id,
                fix="replay_check='warn' (the default: log and count a replay whose rows "
                "differ), 'fail' (stop the query) or 'off' (do not check)",
            )
        self.job_id = job_id
        self.mode = mode

    def tally(self, *, stream_known: bool = True) -> EpochTally:
        """A new epoch's tally: summarising nothing with "off", unless the stream is not
        known (the summary is then what tells a replay from a new stream's batch)."""
        return EpochTally(None if self.mode == "off" and stream_known else ContentTally())

    def check(
        self,
        decided: DecisionRecord,
        batches: Iterable[pa.RecordBatch],
        totals: JobTotals,
        log: JobLogger,
        *,
        stream_known: bool = True,
    ) -> None:
        """A replay of the decided (and finished) epoch `decided` was given `batches`: read
        and summarise them, then `compare`. A replay that cannot be read is logged, never
        raised (the epoch is committed whatever it holds), unless the stream is not known
        (`stream_known` False): then the rows are what tells a replay from another stream's
        batch, so they are always read and compared, and a replay that cannot be proven is
        refused (`compare`)."""
        committed = decided.content
        if stream_known and (self.mode == "off" or committed is None):
            return
        tally = ContentTally(
            digest=committed is not None
            and committed.digest is not None
            and committed.algorithm == ALGORITHM
        )
        try:
            for batch in tally.through(batches):
                del batch
        except Exception as exc:
            if not stream_known:
                raise
            log.warning(
                "the replayed batch could not be read to compare it with the committed epoch "
                "(%s): not checked",
                brief(exc),
            )
            return
        self.compare(decided, tally.summary(), totals, log, stream_known=stream_known)

    def compare(
        self,
        decided: DecisionRecord,
        replayed: ContentSummary | None,
        totals: JobTotals,
        log: JobLogger,
        *,
        stream_known: bool = True,
    ) -> None:
        """Compare what a replay (or a losing attempt) of `decided`'s epoch was given with what
        the epoch committed; a difference is logged, counted and, with "fail", raised as
        ReplayMismatchError. Nothing to compare (either summary missing): nothing done.
        When the stream is not known (`stream_known` False) the comparison is what shows that
        the batch is a replay of the decided epoch: a difference, or nothing to compare, is
        EpochOrderError (the batch may be a new stream's, whose ids start again), whatever
        the mode."""
        committed = decided.content
        if not stream_known:
            if committed is None or replayed is None or committed.differs_from(replayed):
                raise unproven_replay(self.job_id, decided, _shown(committed, replayed))
            log.info("the replay gave the rows the epoch committed (%s)", committed)
            return
        if self.mode == "off" or committed is None or replayed is None:
            return
        if not committed.differs_from(replayed):
            log.info("the replay gave the rows the epoch committed (%s)", committed)
            return
        totals.replay_mismatches += 1
        log.warning(
            "Spark replayed epoch %d of job %s with other rows than it committed: committed "
            "%s, replayed %s. The committed rows stay (exactly once); the replay's are not "
            "kept. Likely cause: %s",
            decided.epoch,
            self.job_id,
            committed,
            replayed,
            LIKELY_CAUSE,
        )
        if self.mode == "fail":
            raise ReplayMismatchError(
                f"the replay of epoch {decided.epoch} gave other rows than the epoch committed "
                f"(committed {committed}, replayed {replayed}): {LIKELY_CAUSE}; the committed "
                "rows stay as they were",
                job=self.job_id,
                epoch=decided.epoch,
                fix="make the query deterministic (replayable source data, no rand(), uuid() "
                "or current_timestamp() before the sink). Restarting replays the batch again "
                "and fails again while it differs; to go on with the committed rows, restart "
                "with replay_check='warn'",
            )


def _shown(committed: ContentSummary | None, replayed: ContentSummary | None) -> str:
    if committed is None or replayed is None:
        return "no summary of the rows the epoch committed to compare them with"
    return f"other rows than it committed (committed {committed}, given {replayed})"


def unproven_replay(job_id: str, decided: DecisionRecord, shown: str) -> EpochOrderError:
    """The error for a decided epoch given again when the job does not know the stream it
    writes (or the decision does not name its own) and the rows do not prove a replay:
    `shown` says what the batch was found to hold."""
    return EpochOrderError(
        f"epoch {decided.epoch} was already committed and is given again with {shown}, and "
        "the job cannot tell which stream the batch comes from: it may be a new stream's (a "
        "reset, deleted or moved checkpoint starts batch ids again) rather than a replay. The "
        "decided epoch was finished; nothing of this batch was written",
        job=job_id,
        epoch=decided.epoch,
        fix="let the job know its stream: under Spark Connect pass checkpoint_location= (the "
        "query's checkpointLocation) to durable_sink(...); a query restarted from a new "
        "checkpoint needs a new job_id, or its old checkpoint restored",
    )
