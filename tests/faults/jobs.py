"""What the fault tests share: a real Spark job (on the faults bed, or on any Postgres and
Kafka: `Servers`) whose writer injects a fault at a chosen protocol step of a chosen batch,
the faults themselves, and the checks (every sink read as its readers would, nothing left
prepared or open)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psycopg
from confluent_kafka.admin import AdminClient

from durable_sinks.coordinator import RecoveryReport
from durable_sinks.spark import DurableBatchWriter, durable_sink, sink
from tests.services import KafkaEndpoint, PostgresEndpoint
from tests.spark.streams import (
    kafka_ids,
    postgres_ids,
    prepared_transactions,
    run_available_now,
    source_stream,
    write_input,
)
from tests.support.fault_bed import FaultBed, Later
from tests.support.kafka_reads import open_transactions, partitions_of
from tests.support.toxiproxy import Proxy

ROWS_PER_BATCH = 20
BATCHES = 3
#: The batch every fault hits (the second: the first shows the job works before it).
HIT_EPOCH = 1
#: How soon after a server answers again its batch must have gone on (the issue's bar).
RESUME_WITHIN_S = 5.0

#: The protocol steps of one batch of a Postgres + Kafka job (Kafka is the last resource:
#: its commit is the decision), in order, as the coordinator reports them.
STEPS_PG_KAFKA = (
    "epoch-start",
    "after-begin:postgres",
    "after-begin:kafka",
    "after-write:0:postgres",
    "after-write:0:kafka",
    "after-pre-commit:postgres",
    "after-pre-commit:kafka",
    "after-decision",
    "after-commit:postgres",
    "after-finish",
)
#: Steps of a coordinator's start-up, reached during a ride-out (each failed attempt is
#: followed by a new coordinator, which fences, opens and recovers).
RECOVERY_STEPS = ("recovery:after-fence", "recovery:after-open:postgres", "recovery:after-resolve")


@dataclass
class Fault:
    """Something done to a server at a step: `inject()` runs at the step (it may block, e.g.
    until the server is down) and returns a `Later` for its end (the server answering again),
    or None when the fault is over once inject returns."""

    name: str
    inject: Callable[[], Later[Any] | None]
    #: Whether the batch's attempt must fail: a fault shorter than what the clients absorb
    #: (commit_retry's ~6.4 s in place, with reconnects; librdkafka's own retries, the
    #: transaction intact) may be ridden out without a new attempt.
    fails_attempt: bool = True


@dataclass
class Trigger:
    """Fire `fault` once, when the writer passes `step` (a prefix) of batch `epoch`."""

    epoch: int
    step: str
    fault: Fault
    fired_at: float | None = None
    ended: Later[Any] | None = None


class FaultyWriter(DurableBatchWriter):
    """The product's writer, firing its triggers at their steps (the coordinator calls
    `_on_step` after each protocol step) and noting when each batch was done."""

    def __init__(self, triggers: Sequence[Trigger], *args: Any) -> None:
        self.triggers = list(triggers)
        self.epoch: int | None = None
        self.done_at: dict[int, float] = {}
        super().__init__(*args)

    def _on_step(self, step: str) -> None:
        for trigger in self.triggers:
            due = trigger.fired_at is None and self.epoch == trigger.epoch
            if due and step.startswith(trigger.step):
                trigger.fired_at = time.monotonic()
                trigger.ended = trigger.fault.inject()

    def __call__(self, df: Any, batch_id: int) -> None:
        self.epoch = int(batch_id)
        super().__call__(df, batch_id)
        self.done_at[int(batch_id)] = time.monotonic()


# -- faults ----------------------------------------------------------------------------------
def postgres_restart(bed: FaultBed, mode: str, down_s: float) -> Fault:
    def inject() -> Later[Any]:
        bed.postgres_server.stop(mode)  # type: ignore[arg-type]
        return Later(down_s, bed.postgres_server.start)

    return Fault(f"postgres -m {mode} restart ({down_s:g} s down)", inject)


def postgres_terminate(bed: FaultBed) -> Fault:
    """pg_terminate_backend of every session of the job (the faults bed is this test's
    alone: every client session but the one terminating them)."""

    def inject() -> None:
        with psycopg.connect(bed.postgres_direct.conninfo(), autocommit=True) as conn:
            ended = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
            ).fetchone()
        assert ended is not None
        assert ended[0] > 0, "no session of the job to terminate"

    # Sessions ended after PREPARE may be absorbed by commit_retry (the sink reconnects).
    return Fault("pg_terminate_backend of the job's sessions", inject, fails_attempt=False)


def kafka_restart(bed: FaultBed, down_s: float) -> Fault:
    def inject() -> Later[Any]:
        bed.kafka_server.kill()
        return Later(down_s, bed.kafka_server.start)

    return Fault(
        f"Kafka broker SIGKILL and restart ({down_s:g} s down)", inject, fails_attempt=False
    )


def toxic(proxy: Proxy, name: str, seconds: float, **kind: Any) -> Fault:
    """A Toxiproxy toxic on `proxy` for `seconds` (`kind`: how `Proxy.<method>` makes it,
    e.g. {"method": "reset_peer"} or {"method": "latency", "latency_ms": 300})."""
    method = kind.pop("method")

    def inject() -> Later[Any]:
        held = getattr(proxy, method)(**kind)
        held.__enter__()
        return Later(seconds, lambda: held.__exit__(None, None, None))

    return Fault(f"{name} for {seconds:g} s", inject, fails_attempt=False)


# -- the job ---------------------------------------------------------------------------------
class Servers(Protocol):
    """The servers a job writes to: `job_*` are what its sinks (and a Postgres decision store)
    are given (the faults bed's: through Toxiproxy, whose toxics then act on them); `*_direct`
    reach the same servers for set-up and checks. `FaultBed` is one; `Endpoints` names any
    other Postgres and Kafka (the Kafka cluster; the Postgres primary and standby by their
    multi-host conninfo)."""

    @property
    def job_postgres(self) -> PostgresEndpoint: ...

    @property
    def job_kafka(self) -> KafkaEndpoint: ...

    @property
    def postgres_direct(self) -> PostgresEndpoint: ...

    @property
    def kafka_direct(self) -> KafkaEndpoint: ...


@dataclass(frozen=True)
class Endpoints:
    """A Postgres and a Kafka reached directly, by the job and by the checks alike (e.g. the
    main bed's Postgres and the Kafka cluster)."""

    postgres: PostgresEndpoint
    kafka: KafkaEndpoint

    @property
    def job_postgres(self) -> PostgresEndpoint:
        return self.postgres

    @property
    def postgres_direct(self) -> PostgresEndpoint:
        return self.postgres

    @property
    def job_kafka(self) -> KafkaEndpoint:
        return self.kafka

    @property
    def kafka_direct(self) -> KafkaEndpoint:
        return self.kafka


@dataclass
class Job:
    """A Postgres (+ Kafka) streaming job on `bed`'s servers, and what it should hold."""

    bed: Servers
    spark: Any
    schema: str
    topic: str | None
    job_id: str
    folder: Path
    options: dict[str, Any] = field(default_factory=dict)
    kafka_options: dict[str, Any] = field(default_factory=dict)
    #: Sinks written beside Postgres (and Kafka), e.g. a files sink.
    extra_sinks: list[Any] = field(default_factory=list)
    #: False: no Postgres sink (a Kafka job alone, whose progress topic keeps its decisions).
    postgres: bool = True
    batches: int = BATCHES
    rows_per_batch: int = ROWS_PER_BATCH
    #: What each writer's start-up recovery reported (`writer()` builds one per call).
    recoveries: list[RecoveryReport | None] = field(default_factory=list)

    @property
    def table(self) -> str:
        return f"{self.schema}.events"

    @property
    def source(self) -> Path:
        return self.folder / "in"

    @property
    def checkpoint(self) -> Path:
        return self.folder / "checkpoint"

    def expected(self) -> list[int]:
        return list(range(self.batches * self.rows_per_batch))

    def write_input(self) -> None:
        size = self.rows_per_batch
        for n in range(self.batches):
            write_input(self.source, f"part-{n}.json", range(n * size, (n + 1) * size))

    def sinks(self, *, proxied: bool = True) -> list[Any]:
        """The job's sinks, reaching the servers as a job does (the faults bed's through
        Toxiproxy), or directly."""
        postgres = self.bed.job_postgres if proxied else self.bed.postgres_direct
        kafka = self.bed.job_kafka if proxied else self.bed.kafka_direct
        made = []
        if self.postgres:
            made.append(
                sink("postgres", dsn=postgres.conninfo(), table=self.table, create_table=True)
            )
        if self.topic is not None:
            made.append(
                sink(
                    "kafka",
                    bootstrap_servers=kafka.bootstrap_servers,
                    topic=self.topic,
                    **self.kafka_options,
                )
            )
        return [*made, *self.extra_sinks]

    def writer(self, triggers: Sequence[Trigger] = ()) -> FaultyWriter:
        built = durable_sink(self.sinks(), job_id=self.job_id, **self.options)
        self.recoveries.append(built.recovery)
        built.close()  # the faulty copy starts its own coordinator (and fences this one)
        return FaultyWriter(triggers, built.specs, built.options)

    def run(self, writer: DurableBatchWriter, timeout: float = 300) -> None:
        run_available_now(source_stream(self.spark, self.source), writer, self.checkpoint, timeout)

    # -- checks --------------------------------------------------------------------------
    def prepared(self) -> list[str]:
        """The job's prepared transactions in its Postgres (another test's leftovers are that
        test's failure, not this one's)."""
        return prepared_transactions(self.bed.postgres_direct.conninfo(), self.job_id)

    def check_exactly_once(self) -> None:
        """Every row once in every sink, as its readers see it; nothing left prepared or
        open (no partition of the topic or of its progress topic held by an open
        transaction)."""
        if self.postgres:
            dsn = self.bed.postgres_direct.conninfo()
            assert postgres_ids(dsn, self.table) == self.expected()
            assert self.prepared() == []
        if self.topic is not None:
            kafka = self.bed.kafka_direct
            admin = AdminClient(kafka.config())
            partitions = len(partitions_of(admin, self.topic))
            assert kafka_ids(kafka, self.topic, partitions) == self.expected()
            progress = self.kafka_options.get("progress_topic") or f"{self.topic}-ds-progress"
            assert open_transactions(admin, self.topic, progress) == []


def check_ridden_through(writer: FaultyWriter, triggers: Sequence[Trigger]) -> None:
    """Each trigger fired, the batch it hit was attempted again, and it went on within
    RESUME_WITHIN_S of the server answering again."""
    for trigger in triggers:
        assert trigger.fired_at is not None, f"{trigger.fault.name} never reached {trigger.step}"
    if any(trigger.fault.fails_attempt for trigger in triggers):
        assert writer.failed_attempts >= 1
    for trigger in triggers:
        if trigger.ended is None:
            continue
        trigger.ended.result()
        answering = trigger.ended.finished_at
        assert answering is not None
        done = writer.done_at[trigger.epoch]
        assert done - answering < RESUME_WITHIN_S, (
            f"batch {trigger.epoch} went on {done - answering:.1f} s after the server answered "
            f"again ({trigger.fault.name} at {trigger.step})"
        )
