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
from durable_sinks.core.errors import ConfigError, ReplayMismatchError
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

    def tally(self) -> EpochTally:
        """A new epoch's tally (summarising nothing with "off")."""
        return EpochTally(None if self.mode == "off" else ContentTally())

    def check(
        self,
        decided: DecisionRecord,
        batches: Iterable[pa.RecordBatch],
        totals: JobTotals,
        log: JobLogger,
    ) -> None:
        """A replay of the decided (and finished) epoch `decided` was given `batches`: read
        and summarise them, then `compare`. A replay that cannot be read is logged, never
        raised (the epoch is committed whatever it holds)."""
        committed = decided.content
        if self.mode == "off" or committed is None:
            return
        tally = ContentTally(
            digest=committed.digest is not None and committed.algorithm == ALGORITHM
        )
        try:
            for batch in tally.through(batches):
                del batch
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning(
                "the replayed batch could not be read to compare it with the committed epoch "
                "(%s): not checked",
                brief(exc),
            )
            return
        self.compare(decided, tally.summary(), totals, log)

    def compare(
        self,
        decided: DecisionRecord,
        replayed: ContentSummary | None,
        totals: JobTotals,
        log: JobLogger,
    ) -> None:
        """Compare what a replay (or a losing attempt) of `decided`'s epoch was given with what
        the epoch committed; a difference is logged, counted and, with "fail", raised as
        ReplayMismatchError. Nothing to compare (either summary missing): nothing done."""
        committed = decided.content
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
