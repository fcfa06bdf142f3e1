"""A job's sinks changed between runs: a sink added to a running job starts at the next epoch
(the epochs before it are not written into it), a sink removed keeps what it committed, and
the job's other sinks go on exactly once across the change; built as `durable_sink(...)`
builds the job (spark/_build.py), on the test bed's Postgres and Kafka."""

from __future__ import annotations

import json

import psycopg
import pyarrow as pa
from confluent_kafka.admin import AdminClient

from durable_sinks.coordinator import EpochOutcome
from durable_sinks.sinks.kafka import Kafka
from durable_sinks.sinks.postgres import Postgres
from durable_sinks.spark import JobOptions
from durable_sinks.spark._build import build_coordinator
from durable_sinks.spark._specs import SinkSpec
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint, PostgresEndpoint
from tests.support.kafka_reads import read_committed


def rows(epoch: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array([epoch * 10 + i for i in range(3)], pa.int64())})


def spec(config: object) -> SinkSpec:
    made = SinkSpec.of(config)
    assert made is not None
    return made


def run(specs: list[SinkSpec], job: str, epochs: range) -> list[EpochOutcome]:
    coordinator = build_coordinator(specs, JobOptions(job_id=job), source="query-1")
    try:
        coordinator.start()
        return [coordinator.run_epoch(e, [rows(e)]).outcome for e in epochs]
    finally:
        coordinator.close()


def test_a_kafka_sink_added_to_a_postgres_job_starts_at_the_next_epoch(
    postgres: PostgresEndpoint,
    kafka: KafkaEndpoint,
    admin: AdminClient,
    pg_schema: str,
    topic: str,
    unique: UniqueNames,
) -> None:
    table = f"{pg_schema}.events"
    pg = spec(Postgres(postgres.conninfo(), table, create_table=True))
    kf = spec(Kafka(kafka.bootstrap_servers, topic))
    assert run([pg], unique.job_id, range(2)) == [EpochOutcome.COMMITTED] * 2
    # Added: epochs 2 and 3 go to both; epoch 1 replayed is already decided.
    assert run([pg, kf], unique.job_id, range(1, 4)) == [
        EpochOutcome.ALREADY_COMMITTED,
        EpochOutcome.COMMITTED,
        EpochOutcome.COMMITTED,
    ]
    with psycopg.connect(postgres.conninfo()) as conn:
        ids = [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id")]
    assert ids == [0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32]
    landed = sorted(json.loads(m.value() or b"")["id"] for m in read_committed(kafka, admin, topic))
    assert landed == [20, 21, 22, 30, 31, 32]
    # Removed again: Postgres goes on alone (epoch 3, decided with both and finished, is
    # replayed as already committed); Kafka keeps what it committed.
    assert run([pg], unique.job_id, range(3, 5)) == [
        EpochOutcome.ALREADY_COMMITTED,
        EpochOutcome.COMMITTED,
    ]
    after = sorted(json.loads(m.value() or b"")["id"] for m in read_committed(kafka, admin, topic))
    assert after == landed
    with psycopg.connect(postgres.conninfo()) as conn:
        ids = [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id")]
    assert ids == [e * 10 + i for e in range(5) for i in range(3)]
