"""Refusals a retry cannot cure, told apart from an outage: the cluster rejected the client's
SASL credentials, or the client could not verify a broker's TLS certificate.

librdkafka reports both only through its error callback and keeps retrying the connection:
the call that is waiting (an admin request, `init_transactions`) times out much later with
`_TIMED_OUT`, which reads like an unreachable cluster. `Refusals` (fed by the client's error
callback, clientlog.py) remembers the first such report so the waiting call can stop at once
with a ConfigError that names the cause and its fix.

For a certificate, librdkafka says only "certificate verify failed"; `tls_diagnosis` asks
Python's own TLS client, once, what exactly is wrong (an unknown CA, a host name the
certificate does not name, an expired certificate) with the same CA settings.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError

from durable_sinks.core.errors import ConfigError

from .config import bootstrap_hosts
from .errors import AUTHENTICATION_CODES

#: Words of librdkafka's text for a TLS handshake it gave up on because of the certificate.
TLS_WORDS = ("certificate", "ssl handshake failed")
#: Words of librdkafka's text for a listener that speaks another security protocol.
PROTOCOL_WORDS = ("incorrect security.protocol",)


@dataclass(frozen=True)
class Refusal:
    """What the cluster or the TLS layer refused, with the fix."""

    message: str
    fix: str


class Refusals:
    """The first refusal the client's error callback reported (thread-safe: the callback may
    run in any thread that serves the client)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first: KafkaError | None = None

    def seen(self, error: KafkaError) -> None:
        if not _is_refusal(error):
            return
        with self._lock:
            if self._first is None:
                self._first = error

    def first(self) -> KafkaError | None:
        with self._lock:
            return self._first


def _is_refusal(error: KafkaError) -> bool:
    if error.code() in AUTHENTICATION_CODES:
        return True
    text = error.str().lower()
    return error.code() in (KafkaError._TRANSPORT, KafkaError._SSL) and any(
        word in text for word in (*TLS_WORDS, *PROTOCOL_WORDS)
    )


def explain(error: KafkaError, settings: Mapping[str, Any], bootstrap: str) -> Refusal:
    """The refusal `error` stands for, worded for the job's operator (no secret shown)."""
    if error.code() in AUTHENTICATION_CODES:
        user = settings.get("sasl.username", "<unset>")
        mechanism = settings.get("sasl.mechanism", "GSSAPI")
        return Refusal(
            f"the Kafka cluster at {bootstrap} refused the SASL login of user {user!r} "
            f"({mechanism}): {error.str()}",
            "check sasl.username, sasl.password and sasl.mechanism in producer_config; a "
            "SCRAM user that was deleted or whose password was changed needs the new "
            "credentials (see docs/security.md, rotating credentials); retrying cannot help",
        )
    if any(word in error.str().lower() for word in PROTOCOL_WORDS):
        protocol = settings.get("security.protocol", "plaintext")
        return Refusal(
            f"the Kafka cluster at {bootstrap} speaks another security protocol than "
            f"security.protocol={protocol}: {error.str()}",
            "set security.protocol in producer_config to the listener's (PLAINTEXT, SSL, "
            "SASL_PLAINTEXT or SASL_SSL), or use the bootstrap port of a listener that speaks "
            "yours; retrying cannot help",
        )
    diagnosis = tls_diagnosis(bootstrap, settings)
    return Refusal(
        f"cannot verify the TLS certificate of the Kafka cluster at {bootstrap}: "
        f"{diagnosis or error.str()}",
        "set ssl.ca.location in producer_config to the CA that signed the brokers' "
        "certificates, and connect with a host name the certificates name (bootstrap_servers "
        "and the brokers' advertised listeners); retrying cannot help",
    )


def tls_diagnosis(bootstrap: str, settings: Mapping[str, Any], timeout: float = 5.0) -> str | None:
    """What Python's TLS client says about the first bootstrap broker's certificate with the
    same CA settings (None when it cannot tell: a client certificate is required, the broker
    did not answer, or the handshake succeeds)."""
    context = ssl.create_default_context()
    location = settings.get("ssl.ca.location")
    try:
        protocol = str(settings.get("security.protocol", "plaintext"))
        host, port = bootstrap_hosts(bootstrap, protocol, "kafka")[0]
        if location and Path(str(location)).is_dir():
            context.load_verify_locations(capath=str(location))
        elif location:
            context.load_verify_locations(cafile=str(location))
        if settings.get("ssl.endpoint.identification.algorithm", "https") == "none":
            context.check_hostname = False
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message or exc)
    except (OSError, ValueError, ConfigError):
        return None
