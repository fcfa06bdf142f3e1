"""The job-level options of `durable_sink` (everything else configures the sink)."""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from durable_sinks.coordinator import (
    REPLAY_CHECKS,
    SLOW_PHASE_LOG_S,
    OutagePolicy,
    ReplayCheckMode,
    RetryPolicy,
)
from durable_sinks.core import DeliveryGuarantee
from durable_sinks.core.bad_rows import (
    DEFAULT_MAX_BAD_ROWS,
    BadRowCap,
    BadRowPolicy,
    SchemaEvolution,
    WritePolicy,
)
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.settings import check_types, closest, option_names
from durable_sinks.manifest import DecisionStore

Execution = Literal["driver", "executor"]
EXECUTIONS = ("driver", "executor")
DriverRead = Literal["stream", "partitions", "chunked"]
DRIVER_READS = ("stream", "partitions", "chunked")
StoreTarget = str | os.PathLike[str] | DecisionStore
OnBadRows = Literal["fail", "dead_letter"]
SchemaEvolutionMode = Literal["none", "add_columns"]
#: The dead-letter sink's name when its configuration names it after its kind only (so that
#: a Postgres dead letter beside a Postgres target does not take the target's name).
DEAD_LETTER_NAME = "dead_letters"

#: Driver mode holds at most this many rows of a batch in memory at once (see _arrow.py).
DEFAULT_MAX_ROWS_IN_MEMORY = 1_000_000
#: How long a batch rides out an outage by default (OutagePolicy's: two minutes, a database
#: fail-over or a broker restart, not a maintenance window).
DEFAULT_OUTAGE_TOLERANCE_S = OutagePolicy.tolerance_s


@dataclass(frozen=True)
class JobOptions:
    """How one streaming query writes through durable-sinks.

    Each option is described under its field; docs/guide.md's table of the job options is
    generated from those descriptions (tests/support/docs_reference.py), so they are Markdown
    whose relative links are written as they read in docs/guide.md. (`mode` is the sink's
    option, append or upsert, never the job's `execution`.)
    """

    job_id: str
    """The stable name of the query's output. Keep it the same across restarts; no other query
    may use it. Every participant, marker, fence and decision is keyed by it."""
    decision_store: StoreTarget | None = None
    """Where commit decisions are made durable. Default (`None`): the store one sink of the job
    hosts, e.g. the database of its first Postgres sink ([when you need
    one](#when-you-need-a-decision_store)). A string starting with `postgresql://` or
    `postgres://`, or containing `host=`, `hostaddr=`, `dbname=`, `user=`, `port=` or
    `service=`, is a Postgres DSN (tables in schema `public`); an absolute path (or
    `file:///absolute/path`) is a directory; relative paths, `~` and other URI schemes are
    refused (a relative folder would move with the driver's current directory, and a restarted
    driver would find no decisions). Required when no sink of the job can host one. See
    below."""
    guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE
    """Exactly once, or at least once: see [at-least-once](#at-least-once)."""
    execution: Execution = "driver"
    """Where batches are written. [Driver mode](#driver-mode): the batch is streamed to the
    driver as Arrow and written there by one coordinator. [Executor mode](#executor-mode):
    each partition is written and prepared in its own task."""
    driver_read: DriverRead = "stream"
    """How [driver mode](#driver-mode) reads a batch. `"stream"`: as its partitions finish,
    through PySpark's collect-as-Arrow socket where a probe at `durable_sink(...)` finds it
    working (classic PySpark), partition by partition through the public API otherwise (e.g.
    under Spark Connect); a streamed batch larger than `spark.driver.maxResultSize` is read
    again partition by partition, and so are the query's later batches. `"partitions"`:
    always partition by partition through the public API (nothing cached). `"chunked"`:
    persisted, counted and collected in chunks of `max_rows_in_memory` rows (the cache guards
    against a query that is not deterministic; serverless Spark refuses it)."""
    max_rows_in_memory: int = DEFAULT_MAX_ROWS_IN_MEMORY
    """Driver mode, chunked read: the batch is read in chunks of whole partitions of at most
    this many rows (a larger single partition is read alone). At least 1."""
    one_phase: bool = True
    """A job whose only sink can carry the decision in its own commit (one Postgres sink,
    driver mode, exactly-once) commits each batch in one transaction: no `PREPARE`, no
    decision record in the store. `False` forces two-phase commit."""
    retain_epochs: int = 10_000
    """How many recent epochs the job's bookkeeping keeps (at least 1): older finished
    decisions are deleted after each epoch, the sinks' per-epoch records (Postgres marker
    rows, which are the decisions in one-phase mode; a local Delta table's journal folders)
    every tenth of that many epochs (docs/operations.md, "Retention")."""
    concurrent_writes: bool = True
    """Driver mode: each record batch goes to every sink from one writer thread per sink, the
    sinks writing at the same time and while the next batch is read from Spark (a sink is
    still called from one thread at a time, in order). `False`: written in the thread that
    reads, one sink after the other, for a plugin sink whose client must stay on the thread
    that opened it."""
    outage_tolerance_s: float = DEFAULT_OUTAGE_TOLERANCE_S
    """Seconds (0 or more) a batch rides out retriable failures (a server restarting or
    failing over, connections cut, a Kafka leader election, a transaction the broker timed
    out) without stopping the query: the failed attempt is dropped with its connections and
    the batch is attempted again by a new coordinator (which fences and recovers the old
    attempt) until this many seconds after the first failure; then the query fails with
    `OutageError`. `0`: fail at the first error. See [Outages](#outages)."""
    commit_retry: RetryPolicy = field(default_factory=RetryPolicy)
    """How one phase-2 commit or recovery rollback is retried in place, on the same
    connection, before the attempt counts as failed (then `outage_tolerance_s` takes over):
    `attempts=8` or `tolerance_s=10.0` seconds, whichever comes first, with exponential waits
    from `first_wait_s=0.05` up to `max_wait_s=5.0` seconds: with the defaults 8 calls in
    about 6.4 s."""
    slow_phase_log_s: float = SLOW_PHASE_LOG_S
    """While one phase of a batch (writing, pre_commit, the decision, the commits) runs longer
    than this many seconds, a WARNING names the batch, the phase, its age and each sink call
    it waits on, and again every this many seconds (see
    [A batch is stuck](operations.md#a-batch-is-stuck)). `0`: never. The metrics endpoint
    shows the same as gauges."""
    metrics_port: int | None = None
    """Serve Prometheus metrics on this port (0 to 65535) of the driver, at `/metrics`, on
    every interface ([Metrics](operations.md#metrics)). Default (`None`): no endpoint. Needs
    the `metrics` extra (`pip install 'durable-sinks[metrics]'`, else a `ConfigError` saying
    so). `0`: a free port chosen at start (logged, and `writer.metrics_port`). Writers of one
    process given the same port share one endpoint, labelled by `job`. A port another process
    holds is a `ConfigError` before the query starts."""
    replay_check: ReplayCheckMode = "warn"
    """When Spark replays a batch whose epoch already committed, compare the replayed rows
    (count and an order-independent digest) with the committed ones. `"warn"`: a difference
    is logged at WARNING and counted (the coordinator's `totals.replay_mismatches`); `"fail"`:
    the query stops with `ReplayMismatchError`, after the epoch is finished (the committed
    rows stay); `"off"`: no digest, the replay is not read. Driver mode only. See [Replay
    check](operations.md#replay-check)."""
    on_bad_rows: OnBadRows = "fail"
    """What happens to a row a sink cannot take (a null in a NOT NULL column, a string too
    long, a constraint violated, a Kafka record too large): `"fail"` fails the batch with
    `BadRowsError`, nothing committed; `"dead_letter"` sends it to `dead_letter` in the same
    epoch and the same atomic decision as the good rows. See [dead
    letters](dead-letters.md)."""
    dead_letter: Any = None
    """The dead-letter sink, required with `on_bad_rows="dead_letter"`: any sink, given as a
    sink is (`sink(...)`, a typed configuration, or in the data source's options a JSON
    object with a `kind`), e.g. `sink("postgres", dsn=..., table="events_dead_letters",
    create_table=True)`. Named `dead_letters` unless its configuration names it."""
    max_bad_rows: int | float = DEFAULT_MAX_BAD_ROWS
    """At most this many refused rows per sink and batch: an `int` >= 0 (rows) or a `float` in
    (0, 1] (a fraction of the sink's rows in the batch, rounded up); more fail the batch with
    `TooManyBadRowsError`, nothing of it committed anywhere."""
    schema_evolution: SchemaEvolutionMode = "none"
    """`"none"`: a new batch column is refused with `SchemaMismatchError`. `"add_columns"`: it
    is added to every target as a nullable column inside the epoch (so it commits or rolls
    back with the data), and safe widenings (int to bigint, float to double) are applied;
    every target must support it. See [new
    columns](dead-letters.md#new-columns-schema_evolutionadd_columns)."""
    checkpoint_location: str | None = None
    """The query's `checkpointLocation`, where the job reads its query's id (Spark keeps it in
    the checkpoint's `metadata` file), at its first batch; that id is what tells a replay of
    a decided batch from a new stream whose batch ids start again. **Needed under Spark
    Connect when the session runs more than one streaming query, and always on pyspark 4.3's
    Connect** (which runs foreachBatch in a cloned session): there Spark does not tell a
    batch which query runs it, and a job that cannot tell refuses its first batch with
    `ConfigError` rather than guess. Elsewhere optional; given, it must be the running
    query's checkpoint. See [Which stream a job writes](#which-stream-a-job-writes)."""
    first_epoch: int = 0
    """The epoch of the query's first batch: its batch b is the job's epoch `first_epoch + b`.
    `0` for the job's first stream. A query restarted from a new checkpoint (deleted, corrupted
    or moved, or a new one to reprocess the source) starts its batch ids at 0 again, and
    continues the job only with `first_epoch` set to the job's newest epoch + 1: the error that
    stops it without names the value. Keep it for as long as the query runs from that
    checkpoint; a value that does not match what the job holds is refused before anything is
    written. See [Moving a job to a new
    checkpoint](operations.md#moving-a-job-to-a-new-checkpoint)."""
    background_commits: bool = False
    """Return each batch to Spark once its decision is durable and commit it (phase 2: the
    sinks' commits and publishes) in the background while Spark computes the next batch,
    which waits for it before its own decision. Exactly once holds as before (a crash after
    the decision is finished by the next start), but an epoch becomes visible to readers a
    little after its batch returns (up to one batch later; at once when the job stops).
    For jobs whose every sink can commit beside the next epoch's writes (Postgres, S3,
    files, Delta, Iceberg); for others it is off, logged at start. Default False. See
    [Commits in the background](reliability.md#commits-in-the-background)."""

    @property
    def write_policy(self) -> WritePolicy:
        return WritePolicy(BadRowPolicy(self.on_bad_rows), SchemaEvolution(self.schema_evolution))

    @property
    def bad_row_cap(self) -> BadRowCap:
        return BadRowCap(self.max_bad_rows)

    def _require_seconds(self, option: str, fix: str) -> None:
        """ConfigError unless the option is a finite number of seconds >= 0."""
        seconds = getattr(self, option)
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not (0 <= seconds < float("inf"))
        ):
            raise ConfigError(
                f"{option} must be a number of seconds >= 0, not {seconds!r}",
                job=self.job_id,
                fix=fix,
            )

    def __post_init__(self) -> None:
        if not isinstance(self.job_id, str):
            raise ConfigError(
                f"job_id must be a string, not {type(self.job_id).__name__} {self.job_id!r}",
                fix=f"durable_sink(..., job_id={str(self.job_id)!r}): a name that stays the "
                "same across restarts",
            )
        if not self.job_id.strip():
            raise ConfigError(
                "durable_sink needs job_id: the stable name of this query's output",
                fix="durable_sink(..., job_id='orders'); keep it the same across restarts "
                "and unique to this query",
            )
        try:
            object.__setattr__(self, "guarantee", DeliveryGuarantee(self.guarantee))
        except ValueError:
            raise ConfigError(
                f"guarantee {self.guarantee!r} is not one of "
                f"{[g.value for g in DeliveryGuarantee]}",
                job=self.job_id,
                fix="guarantee='exactly_once' (the default) or 'at_least_once'",
            ) from None
        if self.execution not in EXECUTIONS:
            raise ConfigError(
                f"execution {self.execution!r} is not 'driver' or 'executor'",
                job=self.job_id,
                fix="execution='driver' (the default) or execution='executor'",
            )
        if self.driver_read not in DRIVER_READS:
            raise ConfigError(
                f"driver_read {self.driver_read!r} is not one of {list(DRIVER_READS)}",
                job=self.job_id,
                fix="driver_read='stream' (the default: the fastest read that works here), "
                "'partitions' (public Spark API only, partition by partition) or 'chunked' "
                "(bounded by max_rows_in_memory, at the price of caching the batch)",
            )
        if not isinstance(self.max_rows_in_memory, int) or self.max_rows_in_memory < 1:
            raise ConfigError(
                f"max_rows_in_memory must be a positive integer, not {self.max_rows_in_memory!r}",
                job=self.job_id,
                fix=f"leave the default ({DEFAULT_MAX_ROWS_IN_MEMORY:,}) or give e.g. 200_000",
            )
        self._require_seconds(
            "outage_tolerance_s",
            f"leave the default ({DEFAULT_OUTAGE_TOLERANCE_S:g}), give e.g. 300 to ride out "
            "longer outages, or 0 to fail at the first error",
        )
        self._require_seconds(
            "slow_phase_log_s",
            f"leave the default ({SLOW_PHASE_LOG_S:g}), or 0 to log no slow phase",
        )
        first = self.first_epoch
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ConfigError(
                f"first_epoch must be an integer >= 0, not {first!r}",
                job=self.job_id,
                fix="leave it out (0) for a job's first stream; a query started from a new "
                "checkpoint takes the job's newest epoch + 1 (the error that stops it names it)",
            )
        port = self.metrics_port
        if port is not None and (
            isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
        ):
            raise ConfigError(
                f"metrics_port must be a TCP port (0 to 65535) or None, not {port!r}",
                job=self.job_id,
                fix="metrics_port=9464 (any free port of the driver; 0: one chosen for you, "
                "logged at start), or leave it out for no metrics endpoint",
            )
        if self.replay_check not in REPLAY_CHECKS:
            raise ConfigError(
                f"replay_check {self.replay_check!r} is not one of {list(REPLAY_CHECKS)}",
                job=self.job_id,
                fix="replay_check='warn' (the default: log and count a replayed batch whose rows "
                "differ from the committed ones), 'fail' (stop the query) or 'off'",
            )
        self._check_bad_rows()
        if not isinstance(self.retain_epochs, int) or self.retain_epochs < 1:
            raise ConfigError(
                f"retain_epochs must be a positive integer, not {self.retain_epochs!r}",
                job=self.job_id,
                fix="leave the default (10,000) or give how many recent decisions to keep",
            )

    def _check_bad_rows(self) -> None:
        if self.on_bad_rows not in {p.value for p in BadRowPolicy}:
            raise ConfigError(
                f"on_bad_rows {self.on_bad_rows!r} is not 'fail' or 'dead_letter'",
                job=self.job_id,
                fix="on_bad_rows='fail' (the default) or on_bad_rows='dead_letter' with "
                "dead_letter=sink(...)",
            )
        if self.schema_evolution not in {e.value for e in SchemaEvolution}:
            raise ConfigError(
                f"schema_evolution {self.schema_evolution!r} is not 'none' or 'add_columns'",
                job=self.job_id,
                fix="schema_evolution='add_columns' adds new nullable columns to the targets; "
                "leave it out to refuse them",
            )
        location = self.checkpoint_location
        if location is not None and (not isinstance(location, str) or not location.strip()):
            raise ConfigError(
                f"checkpoint_location must be the query's checkpointLocation (a path), not "
                f"{location!r}",
                job=self.job_id,
                fix="checkpoint_location='s3a://bucket/checkpoints/orders', the same path as "
                ".option('checkpointLocation', ...) on the query",
            )
        try:
            BadRowCap(self.max_bad_rows)
        except ConfigError as exc:
            raise ConfigError(exc.message, job=self.job_id, fix=exc.fix) from None
        if self.dead_letter is not None:
            object.__setattr__(
                self, "dead_letter", _dead_letter_spec(self.dead_letter, self.job_id)
            )
        if self.on_bad_rows == "dead_letter" and self.dead_letter is None:
            raise ConfigError(
                "on_bad_rows='dead_letter' needs dead_letter: the sink the refused rows go to",
                job=self.job_id,
                fix="dead_letter=sink('postgres', dsn=..., table='events_dead_letters', "
                "create_table=True) (or a Kafka topic, an S3 prefix, a files path; "
                "docs/dead-letters.md)",
            )
        if self.dead_letter is not None and self.on_bad_rows != "dead_letter":
            raise ConfigError(
                "dead_letter is given but on_bad_rows is 'fail': no row would go to it",
                job=self.job_id,
                fix="add on_bad_rows='dead_letter', or drop dead_letter",
            )

    @classmethod
    def split(cls, options: Mapping[str, Any]) -> tuple[JobOptions, dict[str, Any]]:
        """Job options from `options`, and what is left (the sink's configuration; `mode` is
        the sink's, Postgres's and Delta's append/upsert)."""
        names = set(cls.__dataclass_fields__)
        job = {k: v for k, v in options.items() if k in names}
        rest = {k: v for k, v in options.items() if k not in names}
        if rest.get("mode") in EXECUTIONS:
            raise ConfigError(
                f"mode={rest['mode']!r} is the sink's option (append or upsert); where batches "
                "are written is the job's execution option",
                job=str(job.get("job_id", "")),
                fix=f"execution={rest['mode']!r}",
            )
        if "job_id" not in job:
            misspelt = [k for k in rest if closest(k, ["job_id"])]
            if misspelt:
                raise ConfigError(
                    f"durable_sink needs job_id; it got {misspelt[0]!r}, which looks like a "
                    "misspelling of it",
                    fix=f"write job_id= instead of {misspelt[0]}=",
                )
            job["job_id"] = ""
        cls.check_types(job)
        return cls(**job), rest

    @classmethod
    def check_types(cls, options: Mapping[str, Any]) -> None:
        """ConfigError for a job option of the wrong type (values are checked when built).
        job_id, the Literal options and a guarantee string are left to __post_init__, which
        names the accepted values."""
        hints = typing.get_type_hints(cls)
        job = options.get("job_id")
        checked = {
            name: value
            for name, value in options.items()
            if name != "job_id"
            and typing.get_origin(hints[name]) is not Literal
            and not (name == "guarantee" and isinstance(value, str))
        }
        check_types(cls, checked, "durable_sink", job=job if isinstance(job, str) else None)


def job_option_names() -> list[str]:
    """The options `durable_sink` reads for the job (the rest configure the sink)."""
    return option_names(JobOptions)


def _dead_letter_spec(given: Any, job: str) -> Any:
    """The dead-letter sink's SinkSpec from what `dead_letter` was given: a SinkSpec, a typed
    configuration or a mapping with a `kind` (the data source's JSON). Named
    DEAD_LETTER_NAME when its configuration names it after its kind only."""
    from ._specs import SinkSpec

    spec: SinkSpec | None
    if isinstance(given, str) and given.lstrip().startswith("{"):
        try:  # the data source's string option
            given = json.loads(given)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"dead_letter is not a valid JSON object ({exc.msg} at character {exc.pos})",
                job=job,
                fix='.option("dead_letter", \'{"kind": "files", "path": "/data/dead-letters"}\')',
            ) from None
    if isinstance(given, SinkSpec):
        spec = given
    elif isinstance(given, Mapping) and isinstance(given.get("kind"), str):
        spec = SinkSpec(given["kind"], {k: v for k, v in given.items() if k != "kind"})
    else:
        spec = SinkSpec.of(given)
    if spec is None:
        raise ConfigError(
            f"dead_letter must be a sink, not {type(given).__name__}",
            job=job,
            fix="dead_letter=sink('postgres', dsn=..., table='events_dead_letters', "
            "create_table=True), or a typed configuration such as Files(path=...)",
        )
    if spec.name == spec.kind:
        spec = SinkSpec(spec.kind, {**spec.config, "name": DEAD_LETTER_NAME})
    return spec
