"""What the writer tells about each batch: one structured log record per epoch, the job's
counters summed over the writer's coordinators, the Observation the Prometheus endpoint
(`_prometheus.py`, loaded only when a writer has metrics_port) is updated from, and the latest
records by Spark's query and batch id for the progress listener (`_progress.py`). No Spark
here, and no I/O but logging.

Nothing here carries a secret: records hold the job id, sink names, numbers and an error's
class name, never a DSN, a sink's options or an error's message.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from durable_sinks.coordinator import EpochResult, JobTotals, RecoveryReport
from durable_sinks.coordinator._metrics import PHASES
from durable_sinks.core.bad_rows import RefusalCounts
from durable_sinks.core.joblog import JobLogger

if TYPE_CHECKING:
    from ._prometheus import JobMetrics

#: The logger of the one record per epoch (`JobLogger(component="epochs")`).
EPOCH_LOGGER = "durable_sinks.epochs"
#: The outcome of a batch whose foreachBatch call raised.
FAILED = "failed"
#: The histogram's label for the whole foreachBatch call (reading, every attempt, every phase).
TOTAL = "total"


def add_totals(a: JobTotals, b: JobTotals | None) -> JobTotals:
    """`a + b`, field by field (every integer field of JobTotals, including any added later)."""
    if b is None:
        return dataclasses.replace(a)
    summed: dict[str, Any] = {
        f.name: getattr(a, f.name) + getattr(b, f.name)
        for f in dataclasses.fields(JobTotals)
        if isinstance(getattr(a, f.name), int)
    }
    letters = RefusalCounts()
    for totals in (a, b):
        for sink, reasons in totals.dead_letters.by_sink.items():
            letters.add(sink, reasons)
    return JobTotals(**summed, dead_letters=letters)


def in_doubt(report: RecoveryReport | None) -> int:
    """Participants the last start found left prepared (or open) by an earlier driver or
    attempt: those it committed, rolled back or adopted. 0 before any start, or when recovery
    did not run."""
    if report is None or not report.ran:
        return 0
    return len(report.committed) + len(report.rolled_back) + len(report.adopted)


@dataclass(frozen=True)
class Observation:
    """One batch as the metrics see it. `counters` are cumulative for the writer (they only
    grow); the rest is this batch's."""

    job: str
    epoch: int
    outcome: str
    counters: Mapping[str, int]
    #: Rows and bytes this call wrote, per sink (empty for a replay or a failure).
    rows: Mapping[str, int] = field(default_factory=dict)
    bytes: Mapping[str, int] = field(default_factory=dict)
    #: Seconds per phase the epoch went through, and TOTAL for the whole call.
    seconds: Mapping[str, float] = field(default_factory=dict)
    in_doubt: int = 0
    #: Rows each sink refused that this call committed into the dead letter, by reason.
    dead_letters: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @property
    def committed(self) -> bool:
        """Whether the epoch is committed in every sink after this call."""
        return self.outcome != FAILED


def counters(totals: JobTotals, *, failed_batches: int, failed_attempts: int) -> dict[str, int]:
    """The cumulative counters of a writer, named as the metrics are (without the prefix and
    `_total`). `replay_mismatches` is read if JobTotals has it (0 otherwise)."""
    return {
        "epochs_committed": totals.epochs_committed,
        "epochs_already_committed": totals.epochs_skipped,
        "epochs_failed": failed_batches,
        "epochs_retried": failed_attempts,
        "recovered_commits": totals.recovered_commits,
        "recovered_rollbacks": totals.recovered_rollbacks,
        "replay_mismatches": int(getattr(totals, "replay_mismatches", 0)),
    }


def observe(
    job: str,
    epoch: int,
    result: EpochResult | None,
    *,
    seconds: float,
    counts: Mapping[str, int],
    recovery: RecoveryReport | None,
) -> Observation:
    """The Observation of one call: `result` None when it raised; `seconds` the call's."""
    timing = {TOTAL: seconds}
    if result is None:
        return Observation(job, epoch, FAILED, counts, seconds=timing, in_doubt=in_doubt(recovery))
    # A phase with 0 s is one the epoch did not go through (e.g. no pre-commit in one-phase
    # mode): left out, so that its quantiles describe the epochs that ran it.
    timing.update({p: s for p, s in result.metrics.seconds.items() if s > 0})
    return Observation(
        job,
        epoch,
        result.outcome.value,
        counts,
        rows=dict(result.metrics.rows),
        bytes=dict(result.metrics.bytes),
        seconds=timing,
        in_doubt=in_doubt(recovery),
        dead_letters=result.metrics.dead_letters.by_sink,
    )


def increments(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """How much each cumulative counter grew since `before` (what a Prometheus counter is
    increased by). A counter found smaller than before counts from zero again."""
    grown = {}
    for name, value in after.items():
        previous = before.get(name, 0)
        grown[name] = value - previous if value >= previous else value
    return {name: n for name, n in grown.items() if n > 0}


def epoch_record(
    job: str,
    epoch: int,
    result: EpochResult | None,
    *,
    seconds: float,
    attempts: int,
    generation: int | None,
    execution: str,
    error: BaseException | None = None,
) -> dict[str, Any]:
    """The facts of one batch as a JSON-able dict (the `ds_epoch_record` of its log record):
    job, epoch, outcome (`committed`, `already_committed` or `failed`), attempts (1 unless an
    outage was ridden out), generation (of the writer's coordinator; `decision_generation`
    is the one that decided the epoch), execution, rows and bytes per sink, milliseconds per
    phase and in all (`ms`, `total_ms`), record batches, and for a failure the error's class
    (its message may name servers; it is in the ERROR line logged beside)."""
    record: dict[str, Any] = {
        "job": job,
        "epoch": epoch,
        "outcome": FAILED if result is None else result.outcome.value,
        "attempts": attempts,
        "generation": generation,
        "execution": execution,
        "total_ms": round(seconds * 1e3, 3),
    }
    if result is not None:
        metrics = result.metrics
        record.update(
            decision_generation=result.decision.generation,
            rows=dict(metrics.rows),
            bytes=dict(metrics.bytes),
            batches=metrics.batches,
            ms={p: round(metrics.seconds.get(p, 0.0) * 1e3, 3) for p in PHASES},
            protocol_ms=round(metrics.protocol_seconds * 1e3, 3),
        )
        if metrics.dead_letters:
            record["dead_letters"] = {s: dict(r) for s, r in metrics.dead_letters.by_sink.items()}
    if error is not None:
        record["error"] = type(error).__name__
    return record


def log_epoch(log: JobLogger, record: Mapping[str, Any]) -> None:
    """Log `record` at INFO on `durable_sinks.epochs` (log: a JobLogger of component
    "epochs"), with the record in the extras `ds_epoch_record` (the dict) and `ds_epoch_json`
    (one line of JSON, for a plain `%(ds_epoch_json)s` format)."""
    rows = sum(record.get("rows", {}).values())
    text = f"{record['outcome']}: {rows} rows in {record['total_ms']:.1f} ms"
    if "protocol_ms" in record:
        text += f" (protocol {record['protocol_ms']:.1f} ms)"
    letters = sum(sum(r.values()) for r in record.get("dead_letters", {}).values())
    if letters:
        text += f", {letters} rows to the dead letter"
    if record.get("error"):
        text += f": {record['error']}"
    if record["attempts"] > 1:
        text += f", {record['attempts']} attempts"
    extra = {
        "ds_epoch_record": dict(record),
        "ds_epoch_json": json.dumps(record, sort_keys=True, separators=(",", ":")),
    }
    log.bind(epoch=int(record["epoch"])).info("%s", text, extra=extra)


class RecentEpochs:
    """The latest epoch records of this process, by (Spark's query id, Spark's batch id), for
    the progress listener (`_progress.py`) to join with the query's progress. Bounded: beyond
    `limit` records the oldest is dropped. Thread-safe (the writer puts from the batch's
    thread, listeners read from Spark's listener thread)."""

    def __init__(self, limit: int = 1000) -> None:
        self.limit = limit
        self._records: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, query: str, batch: int, record: Mapping[str, Any]) -> None:
        """Keep `record` as batch `batch` of query `query` (a later call for the same batch,
        its replay, replaces it)."""
        with self._lock:
            key = (query, batch)
            self._records.pop(key, None)
            self._records[key] = dict(record)
            while len(self._records) > self.limit:
                self._records.popitem(last=False)

    def get(self, query: str, batch: int) -> dict[str, Any] | None:
        """The record of batch `batch` of query `query` (a copy); None when no writer of this
        process wrote that batch, or it was dropped. Records stay: every listener of the
        process reads them."""
        with self._lock:
            record = self._records.get((query, batch))
            return None if record is None else dict(record)

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)


#: This process's epoch records awaiting their query progress event.
RECENT = RecentEpochs()


class BatchObserver:
    """A writer's account of its batches: the counters of the coordinators it closed (JobTotals
    start at 0 with each coordinator), failed calls, the record per epoch and, once `serve`d,
    its Prometheus metrics. Used under the writer's lock."""

    def __init__(self, job: str, execution: str) -> None:
        self.job, self.execution = job, execution
        self.log = JobLogger(job, component="epochs")
        self.metrics: JobMetrics | None = None
        self.past_totals = JobTotals()
        #: foreachBatch calls that raised.
        self.failed_batches = 0

    def serve(self, port: int | None) -> None:
        """With a port: this process's Prometheus endpoint for it (started if none is).
        ConfigError when prometheus-client is missing or the port cannot be bound."""
        if port is not None and self.metrics is None:
            from ._prometheus import JobMetrics

            self.metrics = JobMetrics(port, self.job)

    def started(self, recovery: RecoveryReport | None) -> None:
        """A coordinator started (its recovery found `recovery`)."""
        if self.metrics is not None:
            self.metrics.started(in_doubt(recovery))

    def closed(self, totals: JobTotals) -> None:
        """A coordinator was closed: its counters are kept."""
        self.past_totals = add_totals(self.past_totals, totals)

    def totals(self, current: JobTotals | None) -> JobTotals:
        """Every closed coordinator's counters plus the current one's."""
        return add_totals(self.past_totals, current)

    def batch(
        self,
        epoch: int,
        result: EpochResult | None,
        *,
        seconds: float,
        attempts: int,
        failed_attempts: int,
        generation: int | None,
        current: JobTotals | None,
        recovery: RecoveryReport | None,
        error: BaseException | None = None,
        query: str | None = None,
        batch: int | None = None,
    ) -> None:
        """One call done (`result` None: it raised `error`): its record logged, the metrics
        updated, and with Spark's `query` id and `batch` id known, the record kept in RECENT.
        `attempts`: this call's; `failed_attempts`: the writer's, cumulative."""
        if result is None:
            self.failed_batches += 1
        record = epoch_record(
            self.job,
            epoch,
            result,
            seconds=seconds,
            attempts=attempts,
            generation=generation,
            execution=self.execution,
            error=error,
        )
        log_epoch(self.log, record)
        if query is not None and batch is not None:
            RECENT.put(query, batch, record)
        if self.metrics is not None:
            counts = counters(
                self.totals(current),
                failed_batches=self.failed_batches,
                failed_attempts=failed_attempts,
            )
            self.metrics.update(
                observe(self.job, epoch, result, seconds=seconds, counts=counts, recovery=recovery)
            )


__all__ = [
    "EPOCH_LOGGER",
    "FAILED",
    "RECENT",
    "TOTAL",
    "BatchObserver",
    "Observation",
    "RecentEpochs",
    "add_totals",
    "counters",
    "epoch_record",
    "in_doubt",
    "increments",
    "log_epoch",
    "observe",
]
