"""A batch's numbers beside Spark's query progress: `progress_listener(spark)`.

Spark builds a `StreamingQueryProgress` from its own plan and sink only: a foreachBatch sink
shows `numOutputRows` -1 and no `metrics`, and `observedMetrics` holds only what the query's
plan observed before the sink (`Dataset.observe`), so nothing a foreachBatch function computes
can reach it. The listener here receives each progress event, finds the epoch record the
durable-sinks writer of this process kept for that query and batch (`_observe.RECENT`) and
publishes both together: to a callback, to `last`/`recent`, and as one log record on
`durable_sinks.progress`.

It joins in the process that runs the writer's batches and the listener: classic PySpark, in
both execution modes (the coordinator runs on the driver). Under Spark Connect the function
and a listener run in Python processes of the server, apart: `progress_listener` refuses a
Connect session. The data source (`format("durable")`) commits each batch in a fresh Python
process: no record to join there; Spark counts its rows in `sink.numOutputRows` itself.

A published record holds Spark's progress (ids, batch, durations, sources' offsets, observed
metrics the user declared) and the epoch record (job, epoch, outcome, rows and bytes per sink,
milliseconds per phase, dead letters, an error's class): never a DSN, a sink's options or an
error's message.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_sinks.core.errors import ConfigError

from ._observe import RECENT, RecentEpochs
from ._session import is_connect

#: The logger of the one record per joined progress event.
PROGRESS_LOGGER = "durable_sinks.progress"
#: The key of the epoch record in `BatchProgress.as_dict()`.
RECORD_KEY = "durableSinks"
#: Joined records `recent` keeps per query (Spark's `numRecentProgressUpdates` default).
KEEP = 100

_log = logging.getLogger(PROGRESS_LOGGER)


@dataclass(frozen=True)
class BatchProgress:
    """One batch of a streaming query: Spark's progress and the epoch record of the
    durable-sinks writer that wrote it."""

    query_id: str
    run_id: str
    batch_id: int
    #: Spark's StreamingQueryProgress as its JSON (`progress.json`) reads.
    progress: Mapping[str, Any]
    #: The writer's epoch record (`ds_epoch_record` of its log line; docs/operations.md).
    record: Mapping[str, Any] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        """`committed`, or `already_committed` for a batch that had landed before (a replay)."""
        return str(self.record["outcome"])

    @property
    def rows(self) -> Mapping[str, int]:
        """Rows this batch wrote, per sink (empty for a replay)."""
        return dict(self.record.get("rows", {}))

    def as_dict(self) -> dict[str, Any]:
        """Spark's progress with the epoch record under `durableSinks`."""
        return {**self.progress, RECORD_KEY: dict(self.record)}

    def json(self) -> str:
        """`as_dict()` as one line of JSON."""
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))


class ProgressJoin:
    """Joins progress events (Spark's progress JSON) with the epoch records of `records`;
    keeps the last `keep` joined batches per query. Thread-safe. No Spark here."""

    def __init__(
        self,
        on_progress: Callable[[BatchProgress], None] | None = None,
        *,
        keep: int = KEEP,
        records: RecentEpochs = RECENT,
    ) -> None:
        if keep < 1:
            raise ConfigError(f"keep must be at least 1, not {keep}", fix="give keep=1 or more")
        self.on_progress, self.keep, self.records = on_progress, keep, records
        self._recent: dict[str, deque[BatchProgress]] = {}
        self._lock = threading.Lock()

    def progress(self, progress_json: str) -> BatchProgress | None:
        """One progress event: its BatchProgress, published, or None when no writer of this
        process wrote its batch (another sink) or the event repeats the batch this run of the
        query last published (each batch of a run is published once)."""
        progress = json.loads(progress_json)
        query, batch = str(progress["id"]), int(progress["batchId"])
        run = str(progress.get("runId", ""))
        record = self.records.get(query, batch)
        if record is None:
            return None
        joined = BatchProgress(query, run, batch, progress, record)
        with self._lock:
            published = self._recent.setdefault(query, deque(maxlen=self.keep))
            if published and (published[-1].run_id, published[-1].batch_id) == (run, batch):
                return None
            published.append(joined)
        _log.info(
            "query %s batch %d: %s",
            query,
            batch,
            joined.outcome,
            extra={"ds_progress_record": joined.as_dict(), "ds_progress_json": joined.json()},
        )
        if self.on_progress is not None:
            try:
                self.on_progress(joined)
            except Exception as exc:  # noqa: BLE001 - Spark's listener bus would drop it unseen
                _log.warning(
                    "on_progress raised %s for query %s batch %d", type(exc).__name__, query, batch
                )
        return joined

    def last(self, query: Any) -> BatchProgress | None:
        """The newest joined batch of `query` (a StreamingQuery or its id), None before any."""
        with self._lock:
            batches = self._recent.get(_query_id(query))
            return batches[-1] if batches else None

    def recent(self, query: Any) -> list[BatchProgress]:
        """The last `keep` joined batches of `query` (a StreamingQuery or its id), oldest
        first."""
        with self._lock:
            return list(self._recent.get(_query_id(query), ()))


def _query_id(query: Any) -> str:
    return str(query if isinstance(query, str) else query.id)


def progress_listener(
    spark: Any = None,
    *,
    on_progress: Callable[[BatchProgress], None] | None = None,
    keep: int = KEEP,
) -> Any:
    """A StreamingQueryListener that publishes each batch a durable-sinks writer of this
    process wrote, joined with Spark's progress of that batch (BatchProgress): to
    `on_progress` (called on Spark's listener thread; its exceptions are logged, not
    raised), to `listener.last(query)` / `listener.recent(query)`, and as an INFO record on
    `durable_sinks.progress` (extras `ds_progress_record`, `ds_progress_json`).

    With `spark` (a classic SparkSession) it is added to `spark.streams`; remove it with
    `spark.streams.removeListener(listener)`. A Spark Connect session is refused
    (ConfigError): there the batches and the listener run in separate processes of the
    server. What each platform shows: docs/operations.md, "In Spark's query progress"."""
    if spark is not None and is_connect(spark):
        raise ConfigError(
            "progress_listener joins the writer's records in the process that runs the "
            "batches; under Spark Connect the batches run in the server's Python processes",
            fix="read the per-epoch records of the durable_sinks.epochs log or the "
            "metrics_port endpoint; add a Dataset.observe(...) before writeStream for numbers "
            "in query.lastProgress.observedMetrics",
        )
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class DurableProgressListener(StreamingQueryListener, ProgressJoin):
        """Spark's listener interface over a ProgressJoin."""

        def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's method names
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            self.progress(event.progress.json)

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            pass

    listener = DurableProgressListener(on_progress, keep=keep)
    if spark is not None:
        spark.streams.addListener(listener)
    return listener


__all__ = [
    "KEEP",
    "PROGRESS_LOGGER",
    "RECORD_KEY",
    "BatchProgress",
    "ProgressJoin",
    "progress_listener",
]
