"""The faults bed really breaks things: each proxy forwards, a `reset_peer` toxic cuts a live
connection, a `timeout` toxic black-holes one, Postgres restarted with `-m immediate` keeps a
prepared transaction, and a SIGKILLed Kafka broker comes back with working transactions for a
client that talks through the proxy."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from psycopg import sql

from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint
from tests.support.fault_bed import FaultBed, Later

QUIET = {"log_level": 0, "log.connection.close": False}


def _server_port(conninfo: str) -> int:
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT inet_server_port()").fetchone()
    assert row is not None
    return int(row[0])


def _advertised_ports(endpoint: KafkaEndpoint) -> list[int]:
    metadata = AdminClient(endpoint.config(QUIET)).list_topics(timeout=10)
    return [broker.port for broker in metadata.brokers.values()]


def test_each_proxy_forwards_and_kafka_clients_stay_on_it(fault_bed: FaultBed) -> None:
    faults = fault_bed.testbed.layout.faults
    proxies = fault_bed.testbed.layout.toxiproxy
    assert _server_port(fault_bed.postgres_proxied.conninfo()) == faults.postgres
    assert _server_port(fault_bed.postgres_direct.conninfo()) == faults.postgres

    # Bootstrapped through the proxy, a client is told the proxy's port; directly, the
    # broker's own: the broker's marker traffic (inter-broker listener) never meets a toxic.
    assert _advertised_ports(fault_bed.kafka_proxied) == [proxies.kafka]
    assert _advertised_ports(fault_bed.kafka_direct) == [faults.kafka]
    # Disabling the proxy takes the proxied Kafka away and leaves the direct one alone.
    with fault_bed.kafka_proxy.disabled():
        with pytest.raises(KafkaException):
            AdminClient(fault_bed.kafka_proxied.config(QUIET)).list_topics(timeout=2)
        assert _advertised_ports(fault_bed.kafka_direct) == [faults.kafka]


def test_reset_peer_cuts_a_live_connection(fault_bed: FaultBed) -> None:
    conn = psycopg.connect(fault_bed.postgres_proxied.conninfo(), autocommit=True)
    try:
        conn.execute("SELECT 1")
        with fault_bed.postgres_proxy.reset_peer() as toxic:
            assert [t.name for t in fault_bed.postgres_proxy.toxics()] == [toxic.name]
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
        assert conn.closed
    finally:
        conn.close()
    assert fault_bed.postgres_proxy.toxics() == []  # removed on leaving the block
    assert _server_port(fault_bed.postgres_proxied.conninfo()) > 0  # and new ones work


def test_timeout_black_holes_new_and_live_connections(fault_bed: FaultBed) -> None:
    live = psycopg.connect(fault_bed.postgres_proxied.conninfo(), autocommit=True)
    try:
        live.execute("SELECT 1")
        outcome: list[BaseException | None] = []

        def query() -> None:
            try:
                live.execute("SELECT 1")
            except psycopg.OperationalError as exc:
                outcome.append(exc)
            else:
                outcome.append(None)

        with fault_bed.postgres_proxy.black_hole():
            # A new connection is accepted by the proxy, then nothing answers: it times out
            # on its own clock rather than being refused.
            started = time.monotonic()
            with pytest.raises(psycopg.OperationalError):
                psycopg.connect(fault_bed.postgres_proxied.conninfo(connect_timeout="2"))
            assert time.monotonic() - started >= 1.5
            # A query on a live connection hangs: the data is dropped...
            worker = threading.Thread(target=query, daemon=True)
            worker.start()
            worker.join(1.5)
            assert worker.is_alive()
            assert outcome == []
        # ...and removing the toxic closes the connection (Toxiproxy's timeout clean-up).
        worker.join(10)
        assert len(outcome) == 1
        assert isinstance(outcome[0], psycopg.OperationalError)
    finally:
        live.close()
    assert _server_port(fault_bed.postgres_proxied.conninfo()) > 0  # new ones work again


@pytest.mark.parametrize("mode", ["immediate", "fast"])
def test_postgres_restart_keeps_a_prepared_transaction(
    fault_bed: FaultBed, fault_pg_schema: str, unique: UniqueNames, mode: str
) -> None:
    table = sql.Identifier(fault_pg_schema, "events")
    gid = unique.name("ds-faults")
    direct = fault_bed.postgres_direct.conninfo()
    # Other tests' in-doubt work on a long-lived bed is not this test's business.
    others = {p.gid for p in fault_bed.prepared_transactions()}
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY)").format(table))
    writer = psycopg.connect(direct)
    writer.execute(sql.SQL("INSERT INTO {} SELECT generate_series(1, 10)").format(table))
    writer.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    writer.close()

    # Stopped at a moment of the test's choosing, started again from a thread 1 s later.
    fault_bed.postgres_server.stop("immediate" if mode == "immediate" else "fast")
    stopped_at = time.monotonic()
    restart = Later(1.0, fault_bed.postgres_server.start)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(fault_bed.postgres_proxied.conninfo(connect_timeout="2"))
    restart.result()
    assert restart.finished_at is not None
    assert restart.finished_at - stopped_at >= 1.0

    assert [p.gid for p in fault_bed.prepared_transactions() if p.gid not in others] == [gid]
    with psycopg.connect(direct, autocommit=True) as conn:
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone() == (0,)
        conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone() == (10,)
    assert [p.gid for p in fault_bed.prepared_transactions() if p.gid not in others] == []


def test_postgres_restart_returns_its_duration(fault_bed: FaultBed) -> None:
    took = fault_bed.postgres_server.restart("immediate", down_seconds=0.5)
    assert 0.5 <= took < 30
    assert _server_port(fault_bed.postgres_proxied.conninfo()) > 0


def _records(endpoint: KafkaEndpoint, topic: str, expected: int) -> list[bytes]:
    consumer = Consumer(
        endpoint.config(
            {
                **QUIET,
                "group.id": f"check-{topic}",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
    )
    seen: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(seen) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append(message.value() or b"")
        # Anything past `expected` (an aborted record shown by mistake) would arrive now.
        extra = consumer.poll(1.0)
        if extra is not None and extra.error() is None:
            seen.append(extra.value() or b"")
    finally:
        consumer.close()
    return seen


@pytest.mark.fault_tier  # the default suite's Kafka kill in tests/faults goes through it
def test_kafka_sigkill_and_restart_then_transactions_commit_through_the_proxy(
    fault_bed: FaultBed, fault_kafka_topic: str, unique: UniqueNames
) -> None:
    txn_id = unique.name("txn")
    config = fault_bed.kafka_proxied.config(
        {**QUIET, "transactional.id": txn_id, "transaction.timeout.ms": 60_000}
    )
    before = Producer(config)
    before.init_transactions(30)
    before.begin_transaction()
    before.produce(fault_kafka_topic, b"committed before the kill")
    before.commit_transaction(30)
    before.begin_transaction()
    before.produce(fault_kafka_topic, b"open at the kill")
    before.flush(30)
    [open_txn] = [t for t in fault_bed.open_kafka_transactions() if t.transactional_id == txn_id]
    assert open_txn.partitions == (f"{fault_kafka_topic}:0",)

    fault_bed.kafka_server.kill()
    took = fault_bed.kafka_server.start()
    assert took < 60
    del before  # a zombie of the old epoch; the new producer fences it

    after = Producer(config)
    after.init_transactions(60)  # aborts the transaction left open at the kill
    after.begin_transaction()
    after.produce(fault_kafka_topic, b"committed after the restart")
    after.commit_transaction(60)

    assert _records(fault_bed.kafka_proxied, fault_kafka_topic, 2) == [
        b"committed before the kill",
        b"committed after the restart",
    ]
    assert txn_id not in [t.transactional_id for t in fault_bed.open_kafka_transactions()]
