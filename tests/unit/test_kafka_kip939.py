"""The KIP-939 probe's logic (sinks/kafka/kip939.py) without a broker: what each answer
says, and that what cannot be read is unknown, never a guess. The probe against the test
bed's broker is tests/integration/test_kafka_kip939.py."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from durable_sinks.sinks.kafka.kip939 import (
    INIT_PRODUCER_ID_KEY,
    TWO_PHASE_SETTING,
    Answer,
    BrokerVersions,
    Kip939Probe,
    broker_api_versions,
    client_answer,
    setting_answer,
    versions_answer,
)


def test_the_broker_needs_init_producer_id_v6() -> None:
    assert versions_answer(("b:9092", {INIT_PRODUCER_ID_KEY: (0, 5)})).value is False
    assert versions_answer(("b:9092", {INIT_PRODUCER_ID_KEY: (0, 6)})).value is True
    absent = versions_answer(("b:9092", {}))
    assert absent.value is False
    assert "no InitProducerId" in absent.why
    unread = versions_answer(OSError("connection refused"))
    assert unread.value is None
    assert "connection refused" in unread.why


def test_the_setting_is_read_never_assumed() -> None:
    assert setting_answer({TWO_PHASE_SETTING: "true"}, None).value is True
    assert setting_answer({TWO_PHASE_SETTING: "false"}, None).value is False
    assert setting_answer({}, None).value is False  # a broker that has no such setting
    unread = setting_answer({}, "no DESCRIBE_CONFIGS on the cluster")
    assert unread.value is None
    assert "DESCRIBE_CONFIGS" in unread.why


def test_the_client_is_read_from_confluent_kafka_itself() -> None:
    class Today:
        pass

    class WithKip939:
        def prepare_transaction(self) -> None: ...

    today = client_answer(Today, ("2.16.1", "2.16.0"))
    assert today.value is False
    assert "librdkafka 2.16.0" in today.why
    assert client_answer(WithKip939, ("9", "9")).value is None  # not known to this version


@pytest.mark.parametrize(
    ("versions", "setting", "cluster"),
    [(True, True, True), (False, True, False), (None, True, None), (None, False, False)],
)
def test_the_cluster_needs_both(
    versions: bool | None, setting: bool | None, cluster: bool | None
) -> None:
    probe = Kip939Probe(Answer(versions, "v"), Answer(setting, "s"), Answer(False, "c"))
    assert probe.cluster.value is cluster
    assert probe.line().startswith("KIP-939 two-phase Kafka transactions: cluster ")


def test_a_secured_listener_is_unknown_without_a_connection() -> None:
    with pytest.raises(ValueError, match="PLAINTEXT only"):
        broker_api_versions([("127.0.0.1", 9)], "SASL_SSL", 1.0)


@pytest.fixture
def server() -> Iterator[tuple[socket.socket, list[bytes]]]:
    """A listening socket on 127.0.0.1 that answers each connection with the next scripted
    bytes."""
    listener = socket.create_server(("127.0.0.1", 0))
    script: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.recv(4096)
                connection.sendall(script.pop(0) if script else b"")

    threading.Thread(target=serve, daemon=True).start()
    yield listener, script
    listener.close()


def answer(correlation: int, error: int, apis: list[tuple[int, int, int]]) -> bytes:
    body = struct.pack(">ihi", correlation, error, len(apis))
    body += b"".join(struct.pack(">hhh", *api) for api in apis)
    return struct.pack(">i", len(body)) + body


def test_an_api_versions_answer_is_read(server: tuple[socket.socket, list[bytes]]) -> None:
    listener, script = server
    port = listener.getsockname()[1]
    script.append(answer(939, 0, [(18, 0, 4), (22, 0, 6)]))
    broker, versions = broker_api_versions([("127.0.0.1", port)], "plaintext", 2.0)
    assert broker == f"127.0.0.1:{port}"
    assert versions == {18: (0, 4), 22: (0, 6)}


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (answer(1, 0, []), "not 939"),
        (answer(939, 35, []), "error code 35"),
        (b"\x00\x00\x00\x20" + b"\x00" * 8, "closed the connection"),
        (b"\xff\xff\xff\xff", "not an ApiVersions answer"),
    ],
)
def test_anything_else_is_unknown_with_why(
    server: tuple[socket.socket, list[bytes]], reply: bytes, why: str
) -> None:
    listener, script = server
    script.append(reply)
    found = BrokerVersions([("127.0.0.1", listener.getsockname()[1])], "plaintext", 2.0).result()
    assert isinstance(found, BaseException)
    assert why in str(found)
    assert versions_answer(found).value is None
