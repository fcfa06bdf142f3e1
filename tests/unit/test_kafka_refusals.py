"""Which librdkafka error reports are refusals a retry cannot cure (sinks/kafka/refusals.py),
and how each is worded: no secret, the cause, the fix."""

from __future__ import annotations

from confluent_kafka import KafkaError

from durable_sinks.sinks.kafka.refusals import Refusals, explain

SETTINGS = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "orders-job",
    "sasl.password": "s3cr3t-pw",
}


def test_refused_logins_and_certificates_are_kept_outages_are_not() -> None:
    refusals = Refusals()
    refusals.seen(KafkaError(KafkaError._TRANSPORT, "Connection refused"))
    refusals.seen(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert refusals.first() is None
    login = KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials")
    refusals.seen(login)
    refusals.seen(
        KafkaError(KafkaError._TRANSPORT, "SSL handshake failed: certificate verify failed")
    )
    assert refusals.first() is not None
    assert refusals.first().code() == KafkaError._AUTHENTICATION  # type: ignore[union-attr]


def test_a_certificate_failure_is_a_refusal() -> None:
    refusals = Refusals()
    refusals.seen(
        KafkaError(KafkaError._TRANSPORT, "error:0A000086:SSL routines::certificate verify failed")
    )
    assert refusals.first() is not None


def test_a_refused_login_names_the_user_and_mechanism_never_the_password() -> None:
    error = KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials")
    refusal = explain(error, SETTINGS, "broker:9093")
    assert "'orders-job'" in refusal.message
    assert "SCRAM-SHA-512" in refusal.message
    assert "sasl.password" in refusal.fix
    assert "s3cr3t-pw" not in refusal.message + refusal.fix


def test_a_listener_of_another_protocol_names_security_protocol() -> None:
    error = KafkaError(
        KafkaError._TRANSPORT,
        "Disconnected while requesting ApiVersion: might be caused by incorrect "
        "security.protocol configuration (connecting to a SSL listener?)",
    )
    refusals = Refusals()
    refusals.seen(error)
    assert refusals.first() is error
    refusal = explain(error, {"security.protocol": "plaintext"}, "127.0.0.1:1")
    assert "security.protocol=plaintext" in refusal.message
    assert "security.protocol" in refusal.fix


def test_a_certificate_refusal_without_an_answering_broker_keeps_librdkafkas_words() -> None:
    error = KafkaError(KafkaError._TRANSPORT, "certificate verify failed")
    refusal = explain(error, {"ssl.ca.location": "/nonexistent/ca.pem"}, "127.0.0.1:1")
    assert "certificate verify failed" in refusal.message
    assert "ssl.ca.location" in refusal.fix
