"""`durable_sink`: the function a streaming query gives `foreachBatch`.

Spark calls it with each micro-batch and its batch id, at least once per batch id (again after
a crash, with the same data for a deterministic query). Each call runs one coordinator epoch
(the batch id is the epoch), so every batch lands in every sink exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import closing
from typing import TYPE_CHECKING, Any, Literal, overload

from durable_sinks import sinks
from durable_sinks.coordinator import (
    Coordinator,
    EpochResult,
    InFlight,
    JobTotals,
    OutagePolicy,
    RecoveryReport,
)
from durable_sinks.core import SinkConnector
from durable_sinks.core.errors import ConfigError, DurableSinkError, UnreachableError, UsageError
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.settings import closest, unknown_option

from ._arrow import (
    ResultTooLargeError,
    chunked_batches,
    group_rows,
    grouped,
    partition_batches,
    socket_batches,
    socket_read_problem,
)
from ._build import build_coordinator, check_job, close_quietly
from ._executor import prepare_on_executors
from ._observe import BatchObserver
from ._options import JobOptions, job_option_names
from ._session import batch_properties, checkpoint_query_id, described, is_connect
from ._shipping import shipped
from ._specs import SinkSpec
from ._worker_check import check_workers

if TYPE_CHECKING:
    from durable_sinks.coordinator import ReplayCheckMode, RetryPolicy
    from durable_sinks.core import DeliveryGuarantee
    from durable_sinks.core.kinds import SinkConfig

    from ._options import DriverRead, Execution, OnBadRows, SchemaEvolutionMode, StoreTarget


class DurableBatchWriter:
    """Writes each micro-batch through a coordinator: `fn(df, batch_id)` for foreachBatch.

    Construction validates everything that can be checked before the query starts (options,
    sink configurations, capabilities for the guarantee and mode, server settings, privileges)
    and starts the coordinator: older drivers of the job are fenced and their leftovers
    resolved. Errors raise here, naming the setting and the fix. A start that meets a server
    mid-fault (a Kafka leader election, a Postgres session lost in a restart or failover) is
    attempted again like a batch, up to `outage_tolerance_s`; a server that cannot be reached
    at all (UnreachableError: a wrong address, a server not running) fails the start at once.

    On each call: the first batch also checks what only Spark can tell (the query id, kept in
    each decision so that another query writing under the same job id is refused).

    Outages are ridden out inside the call (coordinator/_outage.py): an attempt that fails
    with a retriable error (a server restarting, a connection cut, a leader not yet elected)
    is dropped with its connections, and a new coordinator (which fences it and recovers its
    leftovers) attempts the batch again, until `outage_tolerance_s` after the first failure;
    past it the call raises OutageError. Other errors are raised at once. After a failed call
    the coordinator is discarded; the next call (Spark's retry, or the same function given to
    a restarted query) starts a new one, which recovers first.

    One writer serves one streaming query: the first batch binds it to its query's id (stable
    across restarts from the same checkpoint); a call from another query is refused with a
    UsageError before anything is written, and calls never interleave (foreachBatch calls the
    function from each query's own thread; a lock serialises them, so even concurrent calls
    from one query run one after the other).

    An error raised by a batch is logged once at ERROR (class, message, fix, with the job and
    epoch) before Spark wraps it in its own StreamingQueryException, and kept as `last_error`.
    Every call logs one INFO record on `durable_sinks.epochs`, the batch's facts in its extras;
    with `metrics_port` a Prometheus endpoint (started here, or by a Spark Connect copy's first
    batch) is updated after each call (_observe.py, _prometheus.py). Neither fails a batch.

    Under Spark Connect (the active session is a remote one) foreachBatch runs on the Connect
    server, in a Python process of its own, with a pickled copy of this writer. Construction on
    the client then checks without taking the job: options and sink configurations, and,
    where the client reaches them, the servers, settings and capabilities (a server the client
    cannot reach is left to the first batch, with a warning); executor mode's check of Spark's
    Python workers runs through the session as in classic mode. The copy pickles as its
    configuration and the client's version (_shipping.py): on the server it refuses at its
    first batch, before writing, unless the same version of durable-sinks is installed there;
    its first batch starts its coordinator (fencing, recovery) from the configuration alone.
    """

    last_result: EpochResult | None
    failed_attempts: int
    last_error: BaseException | None
    recovery: RecoveryReport | None
    _coordinator: Coordinator | None
    _query_id: str | None
    #: The query id read from checkpoint_location (None before the first batch reads it).
    _stated: str | None
    _last_step: str | None
    _generation: int | None
    _riding_from: int | None
    #: How driver mode reads batches ("socket", "partitions" or "chunked"; _arrow.py), chosen
    #: once a Spark session is known (None before).
    _read: ReadPath | None

    def __init__(self, sinks: Sequence[SinkSpec | SinkConnector], options: JobOptions) -> None:
        if not sinks:
            raise ConfigError(
                "durable_sink needs at least one sink", job=options.job_id, fix="give a kind"
            )
        self.specs = list(sinks)
        self.options = options
        self._reset()
        if not self._workers_checked:
            built = [s for s in self.specs if not isinstance(s, SinkSpec)]
            if built:
                raise ConfigError(
                    f"executor mode builds its sinks on the executors from their options; "
                    f"{_name(built[0])!r} was given as an object",
                    job=options.job_id,
                    fix="give each sink as sink(kind, **options) (or a kind and its options)",
                )
        session = _active_session()
        if session is not None and options.execution == "driver":
            self._choose_read(session)
        if is_connect(session):
            self._check_from_client()
        else:
            self._serve_metrics()
            self._outage.ride(
                self._start,
                after_failure=lambda _error: None,  # (a failed start closed its sinks)
                log=self.log,
                where=lambda: "starting the job (fencing, recovery, checks)",
                rides=_ridden_at_start,
            )
        if not self._workers_checked:
            try:
                self._check_workers(session)
            except BaseException:
                self.close()
                raise

    def __repr__(self) -> str:
        names = ", ".join(_name(s) for s in self.specs)
        return f"DurableBatchWriter(job={self.options.job_id!r}, sinks=[{names}])"

    # -- coordinator lifecycle -----------------------------------------------------------------
    def _start(self, successor_of: int | None = None) -> Coordinator:
        """A new, started coordinator. `successor_of`: the generation it takes over from in a
        ride-out (it refuses to fence a driver that started since; see Coordinator.start)."""
        coordinator = build_coordinator(
            self.specs, self.options, source=self._query_id, on_step=self._step
        )
        try:
            self.recovery = coordinator.start(successor_of=successor_of)
        except BaseException:
            close_quietly(coordinator)
            raise
        finally:  # a start that failed after claiming its generation still claimed it
            self._generation = coordinator.claimed_generation or self._generation
        self._coordinator = coordinator
        self._observer.started(self.recovery)
        return coordinator

    @property
    def totals(self) -> JobTotals:
        """JobTotals summed over every coordinator this writer started (a ride-out or a failed
        call replaces the coordinator, whose own counters start at 0)."""
        return self._observer.totals(self._current_totals())

    def _current_totals(self) -> JobTotals | None:
        return None if self._coordinator is None else self._coordinator.totals

    @property
    def metrics_port(self) -> int | None:
        """The port of the Prometheus endpoint (the chosen one for metrics_port=0); None
        without one, or before a Spark Connect copy's first batch."""
        return None if self._observer.metrics is None else self._observer.metrics.port

    def _serve_metrics(self) -> None:
        """The metrics endpoint (with a metrics_port), showing this writer's epoch in flight."""
        self._observer.serve(self.options.metrics_port)
        if self._observer.metrics is not None:
            self._observer.metrics.watching(self.in_flight)

    def in_flight(self) -> InFlight | None:
        """The batch being written now: its epoch, phase, ages and the sink calls it waits on
        (the coordinator's `watch`); None between batches."""
        coordinator = self._coordinator
        return None if coordinator is None else coordinator.watch.snapshot()

    def _check_from_client(self) -> None:
        """Spark Connect: check the job's configuration and servers from the client, without
        recovering (the server-side copy does, at its first batch). A sink or decision store
        this client cannot reach may be reachable from the server: warned about, not raised."""
        try:
            check_job(self.specs, self.options)
        except UnreachableError as exc:
            self.log.warning(
                "Spark Connect: not reachable from this client (%s); the server checks it at "
                "the query's first batch, before writing",
                exc,
            )

    def _check_workers(self, spark: Any | None) -> None:
        """Executor mode: refuse (ConfigError with the fix) unless Spark's Python workers
        import durable-sinks at this version and build every sink. Without a Spark session
        yet, the first batch checks, before it writes anything."""
        if spark is None:
            return
        specs = [s for s in self.specs if isinstance(s, SinkSpec)]
        check_workers(spark, [(s.kind, s.config) for s in specs], job=self.options.job_id)
        self._workers_checked = True

    def _on_step(self, step: str) -> None:
        """Called after each coordinator step (docs/protocol.md's crash points); crash tests
        override it."""

    def close(self) -> None:
        """Close the coordinator's connections (a later call starts a new one). Waits for a
        batch being written to finish."""
        with self._lock:
            coordinator, self._coordinator = self._coordinator, None
            if coordinator is not None:
                self._observer.closed(coordinator.totals)
                close_quietly(coordinator)

    # -- foreachBatch --------------------------------------------------------------------------
    def __call__(self, df: Any, batch_id: int) -> None:
        epoch = self.options.first_epoch + int(batch_id)
        with self._lock:
            started, attempts = time.perf_counter(), self.failed_attempts
            try:
                with described(df, self._description(epoch)):
                    result = self._write(df, epoch)
            except BaseException as exc:
                self.last_error = exc
                self._report(exc, epoch)
                self._observe(epoch, None, time.perf_counter() - started, attempts, exc)
                raise
            self.last_error = None
            self._observe(epoch, result, time.perf_counter() - started, attempts)

    def _description(self, epoch: int) -> str:
        """How Spark's UI describes the jobs of a batch: the job, the epoch, what they do."""
        if self.options.execution == "executor":
            doing = "executors prepare their partitions"
        else:
            doing = "the driver reads the batch"
        batch = epoch - self.options.first_epoch
        of = f" (batch {batch})" if batch != epoch else ""
        return f"durable-sinks: job {self.options.job_id}, epoch {epoch}{of}, {doing}"

    def _observe(
        self,
        epoch: int,
        result: EpochResult | None,
        seconds: float,
        attempts_before: int,
        error: BaseException | None = None,
    ) -> None:
        """The call's record and metrics (_observe.py); a failure there is only logged."""
        try:
            self._observer.batch(
                epoch,
                result,
                seconds=seconds,
                attempts=self.failed_attempts - attempts_before + 1,
                failed_attempts=self.failed_attempts,
                generation=self._generation,
                current=self._current_totals(),
                recovery=self.recovery,
                error=error,
                query=self._query_id,
                batch=epoch - self.options.first_epoch,
            )
        except Exception as exc:  # noqa: BLE001 - the batch is done: never fail it for this
            self.log.bind(epoch=epoch).warning("could not record the batch: %r", exc)

    def _report(self, exc: BaseException, epoch: int) -> None:
        """Log a batch's failure once, our error's class, message and fix first: Spark shows
        the user its own StreamingQueryException, whose first line is generic."""
        log = self.log.bind(epoch=epoch)
        if isinstance(exc, DurableSinkError):
            log.error("batch failed: %s: %s", type(exc).__name__, exc)
        elif isinstance(exc, Exception):
            log.error("batch failed: unexpected %s: %s", type(exc).__name__, exc, exc_info=exc)

    def _write(self, df: Any, epoch: int) -> EpochResult:
        log = self.log.bind(epoch=epoch)
        self._check_query(df, epoch)
        if not self._workers_checked:
            self._check_workers(df.sparkSession)
        self._serve_metrics()  # a Connect copy's: before writing
        self._riding_from = None
        result = self._outage.ride(
            lambda: self._attempt(df, epoch),
            after_failure=self._attempt_failed,
            log=log,
            where=self._where,
        )
        self.last_result = result
        return result

    def _attempt(self, df: Any, epoch: int) -> EpochResult:
        """One attempt at the batch, with the current coordinator or a new one (which fences
        the failed attempt's and recovers its leftovers first)."""
        self._last_step = None
        coordinator = self._coordinator or self._start(successor_of=self._riding_from)
        coordinator.source = self._query_id
        try:
            if self.options.execution == "executor":
                specs = [s for s in self.specs if isinstance(s, SinkSpec)]
                return coordinator.run_distributed_epoch(
                    epoch,
                    lambda generation: prepare_on_executors(
                        df,
                        specs,
                        self.options,
                        generation,
                        epoch,
                        coordinator.task_briefs(epoch),
                    ),
                )
            return self._driver_epoch(coordinator, df, epoch)
        except BaseException:
            self.close()  # a new coordinator (new generation, recovery) serves the retry
            raise

    def _attempt_failed(self, error: DurableSinkError) -> None:
        """A failed attempt is dropped; the next one takes over from its generation (and
        stops, fenced, if another driver of the job started meanwhile: a driver partitioned
        away must not take the job back from the one that replaced it)."""
        self.failed_attempts += 1
        self._riding_from = self._generation
        self.close()

    def _step(self, step: str) -> None:
        self._last_step = step
        self._on_step(step)

    def _where(self) -> str:
        """Where the failed attempt was, for the ride-out's log and error."""
        if self._last_step is None:
            return "before its first step (connecting, validating, fencing)"
        return f"after step {self._last_step!r}"

    def _choose_read(self, spark: Any) -> ReadPath:
        """Driver mode's read (_arrow.py), chosen once per writer (and per Spark Connect copy)
        and logged: for driver_read="stream" the socket read where its probe passes, the
        public partitions read otherwise."""
        if self._read is not None:
            return self._read
        requested = self.options.driver_read
        problem = None
        if requested == "stream":
            with described(
                spark, f"durable-sinks: job {self.options.job_id}, checking the socket read"
            ):
                problem = socket_read_problem(spark)
            read: ReadPath = "socket" if problem is None else "partitions"
        else:
            read = requested
        self._read = read
        self.log.info(
            "driver mode reads batches %s%s",
            _READ_WORDS[read],
            "" if problem is None else f" (the socket read is unavailable: {problem})",
        )
        return read

    def _driver_epoch(self, coordinator: Coordinator, df: Any, epoch: int) -> EpochResult:
        read = self._choose_read(df.sparkSession)
        if read == "socket":
            try:
                streamed = grouped(
                    socket_batches(df, job=self.options.job_id, epoch=epoch), group_rows(df)
                )
                with closing(streamed):
                    return coordinator.run_epoch(epoch, streamed)
            except ResultTooLargeError as exc:
                # Rolled back before any decision: nothing of the batch is visible. Read it
                # again partition by partition, with a new coordinator (the failed one is done).
                self.log.bind(epoch=epoch).warning(
                    "the batch is larger than spark.driver.maxResultSize (%s); reading it, and "
                    "this query's later batches, partition by partition (driver_read="
                    "'partitions'); raise spark.driver.maxResultSize to stream again",
                    exc,
                )
                self._read = read = "partitions"
                self.close()
                coordinator = self._start()  # (built with this query's id as its source)
        if read == "partitions":
            with closing(grouped(partition_batches(df), group_rows(df))) as batches:
                return coordinator.run_epoch(epoch, batches)
        chunked = chunked_batches(
            df, self.options.max_rows_in_memory, job=self.options.job_id, epoch=epoch
        )
        with closing(chunked):
            return coordinator.run_epoch(epoch, chunked)

    def _check_query(self, df: Any, epoch: int) -> None:
        """What only the running query can tell: its id (kept across restarts from the same
        checkpoint) becomes the coordinator's source, so that a batch of a new stream (a reset
        checkpoint) is never taken for a replay of a decided epoch; the batch id must be
        Spark's. Classic PySpark tells both; Spark Connect the query id only while one query
        of the session is active and never on pyspark 4.3 (_session.py): there the id is read
        from `checkpoint_location`, and without it the batch is refused (ConfigError) before
        anything is written. A call outside a streaming query (classic, a direct call) keeps
        the id of the query the writer served, if any; without one, driver mode goes on (a
        decided epoch given again is then a replay only if its rows match those it
        committed: coordinator/_replay.py) and executor mode, whose rows the driver never
        sees, is refused."""
        if self._query_id is not None and is_connect(df):
            return  # Connect unpickles one copy per query: bound at its first batch
        query_id, running = batch_properties(df)
        batch = epoch - self.options.first_epoch
        if running is not None and int(running) != batch:
            raise UsageError(
                f"called with batch id {batch} while Spark runs batch {running}",
                job=self.options.job_id,
                epoch=epoch,
                fix="pass the writer to foreachBatch as is; do not call it with other ids",
            )
        stated = self._stated_query(df)
        if query_id is None:
            query_id = stated
        elif stated is not None and stated != query_id:
            raise ConfigError(
                f"checkpoint_location {self.options.checkpoint_location!r} is the checkpoint "
                f"of query {stated}, but query {query_id} runs this batch",
                job=self.options.job_id,
                epoch=epoch,
                fix="give checkpoint_location this query's checkpointLocation (or leave it "
                "out: classic Spark tells the query's id)",
            )
        if query_id is None:
            if self._query_id is None:  # (a writer bound to its query keeps its id)
                self._unknown_query(df, epoch)
            return
        if self._query_id is not None and query_id != self._query_id:
            raise UsageError(
                f"this writer already writes the batches of streaming query {self._query_id}; "
                f"query {query_id} called it too, and one writer (one coordinator) serves one "
                "query",
                job=self.options.job_id,
                epoch=epoch,
                fix="give each query its own durable_sink(...), with its own job_id; nothing of "
                "this batch was written",
            )
        self._query_id = query_id

    def _stated_query(self, df: Any) -> str | None:
        """The query id in `checkpoint_location`'s checkpoint (None without the option),
        read once per writer."""
        location = self.options.checkpoint_location
        if location is None:
            return None
        if self._stated is None:
            self._stated = checkpoint_query_id(df.sparkSession, location, job=self.options.job_id)
        return self._stated

    def _unknown_query(self, df: Any, epoch: int) -> None:
        """Neither Spark nor `checkpoint_location` tells which query runs the batch."""
        if is_connect(df):
            raise ConfigError(
                "Spark Connect does not tell this batch which streaming query runs it (the "
                "session has more than one active query, or this pyspark runs foreachBatch in "
                "a session of its own), and the job must know it: a query restarted from a "
                "new checkpoint starts its batch ids again, and its batches must not be taken "
                "for replays of batches already committed. Nothing of this batch was written",
                job=self.options.job_id,
                epoch=epoch,
                fix="durable_sink(..., checkpoint_location=<the query's checkpointLocation>): "
                "the job reads the query's id from the checkpoint",
            )
        if self.options.execution == "executor":
            raise UsageError(
                "executor mode was called outside a streaming query: it cannot tell a replay "
                "of a committed batch from new rows, since the rows never reach the driver",
                job=self.options.job_id,
                epoch=epoch,
                fix="give the writer to a streaming query's foreachBatch, or use driver mode",
            )
        self.log.bind(epoch=epoch).debug(
            "called outside a streaming query: a replayed batch id is checked by its rows"
        )

    # -- pickling (Spark Connect runs foreachBatch in a server-side process) -------------------
    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (by cloudpickle, as Spark does) as a version-checked copy: _shipping.py."""
        from durable_sinks import __version__

        return shipped(self, __version__, self.options.job_id)

    def __getstate__(self) -> dict[str, Any]:
        return {"specs": self.specs, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.specs = state["specs"]
        self.options = state["options"]
        self._reset()

    def _reset(self) -> None:
        """The state a writer starts with (after construction, or unpickled elsewhere): no
        coordinator, no query bound, no results."""
        self.log = JobLogger(self.options.job_id, component="spark")
        #: The record per batch, the counters across coordinators, the metrics endpoint.
        self._observer = BatchObserver(self.options.job_id, self.options.execution)
        self.last_result = None
        self.last_error = None
        self.recovery = None
        self._coordinator = None
        self._query_id = None
        self._stated = None
        self._lock = threading.RLock()
        self._read = None
        self._outage = OutagePolicy(tolerance_s=self.options.outage_tolerance_s)
        #: Attempts at batches that failed and were attempted again (outages ridden out).
        self.failed_attempts = 0
        self._last_step = None
        #: The newest generation this writer's coordinators claimed, and the one a ride-out's
        #: next attempt takes over from (None outside a ride-out).
        self._generation = None
        self._riding_from = None
        #: Executor mode: whether Spark's Python workers were found able to write.
        self._workers_checked = self.options.execution != "executor"


def _ridden_at_start(error: DurableSinkError) -> bool:
    """Which failures of the job's first start are attempted again: those of servers that
    answered but are mid-fault. A server not reached at all is reported at once, so that a
    wrong address does not wait out the bound before its error."""
    return error.retriable and not isinstance(error, UnreachableError)


@overload
def durable_sink(
    sinks: SinkConfig | Sequence[SinkConfig | SinkSpec | SinkConnector],
    /,
    *,
    job_id: str,
    decision_store: StoreTarget | None = None,
    guarantee: DeliveryGuarantee | Literal["exactly_once", "at_least_once"] = ...,
    execution: Execution = "driver",
    driver_read: DriverRead = "stream",
    max_rows_in_memory: int = ...,
    one_phase: bool = True,
    retain_epochs: int = ...,
    concurrent_writes: bool = True,
    outage_tolerance_s: float = ...,
    commit_retry: RetryPolicy = ...,
    slow_phase_log_s: float = ...,
    metrics_port: int | None = None,
    replay_check: ReplayCheckMode = "warn",
    on_bad_rows: OnBadRows = "fail",
    dead_letter: SinkConfig | SinkSpec | None = None,
    max_bad_rows: int | float = ...,
    schema_evolution: SchemaEvolutionMode = "none",
    checkpoint_location: str | None = None,
    first_epoch: int = 0,
    background_commits: bool = False,
) -> DurableBatchWriter: ...
@overload
def durable_sink(kind: str, /, **options: Any) -> DurableBatchWriter: ...
def durable_sink(
    kind_or_sinks: str | SinkConfig | Sequence[SinkConfig | SinkSpec | SinkConnector],
    /,
    **options: Any,
) -> DurableBatchWriter:
    """The `foreachBatch` function that writes each micro-batch exactly once.

    One sink, typed: `durable_sink(Postgres(dsn=..., table="events"), job_id="orders")`:
    the kind's typed configuration (core.kinds.SinkConfig: `durable_sinks.Postgres`, `Kafka`,
    ..., one per built-in kind) holds the sink's options, the keywords are the job's
    (JobOptions: job_id, decision_store, guarantee, execution, ...); a type checker checks
    both.
    One sink, by kind: `durable_sink("postgres", dsn=..., table="events", job_id="orders")`:
    the sink's options and the job's in one set of keywords.
    Several sinks, one atomic decision per batch:
    `durable_sink([Postgres(...), Kafka(...)], job_id="orders")` (or `sink("postgres", ...)`
    items, in any mix).

    Everything is validated here, before the query starts (see DurableBatchWriter).
    """
    job, rest = JobOptions.split(options)
    typed = SinkSpec.of(kind_or_sinks)
    if isinstance(kind_or_sinks, str):
        _check_names(kind_or_sinks, rest, job.job_id)
        specs: list[SinkSpec | SinkConnector] = [SinkSpec(kind_or_sinks, rest)]
    elif typed is not None:
        _no_sink_options(rest, job.job_id, f"{type(kind_or_sinks).__name__}(...)")
        specs = [typed]
    elif isinstance(kind_or_sinks, Sequence) and kind_or_sinks:
        _no_sink_options(rest, job.job_id, "each sink's configuration")
        specs = []
        for item in kind_or_sinks:
            if isinstance(item, SinkSpec | SinkConnector):
                specs.append(item)
                continue
            spec = SinkSpec.of(item)
            if spec is None:
                raise ConfigError(
                    f"{type(item).__name__} is not a sink",
                    job=job.job_id,
                    fix="give each as a typed configuration (Postgres(dsn=..., table=...), "
                    "Kafka(...), ...) or as sink(kind, **options)",
                )
            specs.append(spec)
    else:
        raise ConfigError(
            "durable_sink needs a sink kind, a typed sink configuration or a non-empty list "
            "of sinks",
            job=job.job_id,
            fix="durable_sink(Postgres(...), job_id=...), durable_sink('postgres', ...) or "
            "durable_sink([Postgres(...), Kafka(...)], job_id=...)",
        )
    return DurableBatchWriter(specs, job)


def _no_sink_options(rest: Mapping[str, Any], job: str, where: str) -> None:
    """Typed or list forms: every keyword is a job option (the sinks' are in `where`)."""
    if not rest:
        return
    names = sorted(rest)
    guess = closest(names[0], job_option_names())
    if guess is not None:
        raise unknown_option(names[0], "durable_sink", job_option_names(), job=job)
    raise ConfigError(
        f"options {names} are not job options; the sinks' options go into {where}",
        job=job,
        fix="durable_sink(Postgres(dsn=..., table=...), job_id=...) or "
        "durable_sink([sink('postgres', dsn=..., table=...), ...], job_id=...)",
    )


def _check_names(kind: str, options: Mapping[str, Any], job: str) -> None:
    """One-sink form: every option is the sink's or the job's; a misspelt one is named with
    the closest of both."""
    names = sinks.options_of(kind)
    if names is None:
        return  # a bare-callable plugin checks its own options
    for name in options:
        if name not in names:
            raise unknown_option(
                name, f"durable_sink({kind!r}, ...)", [*names, *job_option_names()], job=job
            )


def _active_session() -> Any | None:
    """The Spark session of this thread, if one is running."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


ReadPath = Literal["socket", "partitions", "chunked"]
_READ_WORDS: dict[ReadPath, str] = {
    "socket": "through PySpark's collect-as-Arrow socket, as partitions finish",
    "partitions": "partition by partition through Spark's public API (mapInArrow, "
    "toLocalIterator; nothing cached)",
    "chunked": "persisted, in chunks of at most max_rows_in_memory rows",
}


def _name(spec: SinkSpec | SinkConnector) -> str:
    return spec.name
