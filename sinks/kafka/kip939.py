"""Whether the cluster and the client could run KIP-939 two-phase Kafka transactions, read at
the sink's start and by `durable-sinks doctor` (informational: the sink does not build on them).

KIP-939 lets a Kafka transaction be prepared by one process and completed by another: a
producer started with `initTransactions(keepPreparedTxn=true)` (InitProducerId v6) keeps
what an earlier producer of the same transactional.id prepared, instead of aborting it, and
completes or aborts it as a decision says. That would make Kafka a resumable participant
(no last-resource limit of one Kafka sink per job, a driver that dies after preparing leaves
nothing for the broker to time out) and allow executor-mode Kafka writes. It needs:

- the broker: InitProducerId version 6 or later advertised (ApiVersions) and
  `transaction.two.phase.commit.enable=true`;
- the client: an API to prepare a transaction and complete it from another producer.
  librdkafka has none in any release (confluent-kafka exposes librdkafka's transactional API
  only), so the client's answer is read from confluent-kafka itself: the producer methods
  such an API would add.

Nothing is guessed: what cannot be read (a SASL or SSL listener, which this plain probe does
not speak; no DESCRIBE_CONFIGS on the cluster; a broker that does not answer) is unknown,
with why.

The broker's API versions: librdkafka reads them but does not hand them to Python, so the
probe sends one ApiVersions request (version 0, the one every broker answers) over a plain
socket to a bootstrap broker: a few milliseconds, run beside the start's other requests.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: The Kafka protocol's API keys the probe reads.
API_VERSIONS_KEY = 18
INIT_PRODUCER_ID_KEY = 22
#: InitProducerId's first version with KIP-939's keepPreparedTxn.
KIP939_INIT_PRODUCER_ID_VERSION = 6
#: The broker setting that turns two-phase commit participation on.
TWO_PHASE_SETTING = "transaction.two.phase.commit.enable"
#: Producer methods a client with KIP-939 would have (the Java producer's names, in Python's
#: style): confluent-kafka has neither in any release so far.
CLIENT_METHODS = ("prepare_transaction", "complete_transaction")
#: The client id of the probe's request (brokers log it).
CLIENT_ID = b"durable-sinks-kip939-probe"
#: The largest ApiVersions answer the probe reads (a broker's is about 0.5 KB).
MAX_ANSWER_BYTES = 1 << 20


@dataclass(frozen=True)
class Answer:
    """Yes (True), no (False) or unknown (None), and what it rests on."""

    value: bool | None
    why: str

    def words(self) -> str:
        said = {True: "yes", False: "no", None: "unknown"}[self.value]
        return f"{said} ({self.why})"


@dataclass(frozen=True)
class Kip939Probe:
    """What the probe found: the broker's InitProducerId version, its two-phase setting, and
    the client."""

    versions: Answer
    setting: Answer
    client: Answer

    @property
    def cluster(self) -> Answer:
        """Both broker conditions: no if either is no, yes if both are yes, else unknown."""
        parts = (self.versions, self.setting)
        why = "; ".join(p.why for p in parts)
        if any(p.value is False for p in parts):
            return Answer(False, why)
        if all(p.value is True for p in parts):
            return Answer(True, why)
        return Answer(None, why)

    def line(self) -> str:
        """One line for the log and `durable-sinks doctor`."""
        return (
            f"KIP-939 two-phase Kafka transactions: cluster {self.cluster.words()}; client "
            f"{self.client.words()}; the sink does not build on them (Kafka stays the job's "
            "last resource)"
        )


def broker_api_versions(
    hosts: Sequence[tuple[str, int]], protocol: str, timeout: float
) -> tuple[str, dict[int, tuple[int, int]]]:
    """The API versions the first bootstrap broker that answers advertises (ApiVersions v0
    over a plain socket): (its host:port, {api key: (min, max)}). OSError or ValueError when
    none answers, or answers what is not an ApiVersions v0 answer."""
    if protocol.lower() != "plaintext":
        raise ValueError(
            f"security.protocol is {protocol}: the probe speaks PLAINTEXT only and does not log in"
        )
    failures: list[str] = []
    for host, port in hosts:
        try:
            return f"{host}:{port}", _ask(host, port, timeout)
        except (OSError, ValueError, struct.error) as exc:
            failures.append(f"{host}:{port}: {exc}")
    raise OSError("no bootstrap broker answered ApiVersions: " + "; ".join(failures))


def _ask(host: str, port: int, timeout: float) -> dict[int, tuple[int, int]]:
    correlation = 939
    # Request header v1 (api key, version, correlation id, client id); ApiVersions v0 has no
    # body.
    request = struct.pack(">hhih", API_VERSIONS_KEY, 0, correlation, len(CLIENT_ID)) + CLIENT_ID
    with socket.create_connection((host, port), timeout=timeout) as connection:
        connection.settimeout(timeout)
        connection.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _read(connection, 4))
        if not 10 <= size <= MAX_ANSWER_BYTES:
            raise ValueError(f"an answer of {size} bytes is not an ApiVersions answer")
        answer = _read(connection, size)
    got, error, count = struct.unpack_from(">ihi", answer, 0)
    if got != correlation:
        raise ValueError(f"the answer is to request {got}, not {correlation}")
    if error != 0:
        raise ValueError(f"the broker answered ApiVersions with error code {error}")
    if not 0 <= count <= (size - 10) // 6:
        raise ValueError(f"the answer lists {count} APIs in {size} bytes")
    versions: dict[int, tuple[int, int]] = {}
    for i in range(count):
        key, low, high = struct.unpack_from(">hhh", answer, 10 + 6 * i)
        versions[key] = (low, high)
    return versions


def _read(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ValueError("the broker closed the connection mid-answer")
        data += chunk
    return data


def versions_answer(found: tuple[str, dict[int, tuple[int, int]]] | BaseException) -> Answer:
    """Whether the broker advertises KIP-939's InitProducerId version."""
    if isinstance(found, BaseException):
        return Answer(None, f"its API versions could not be read: {found}")
    broker, versions = found
    init = versions.get(INIT_PRODUCER_ID_KEY)
    if init is None:
        return Answer(False, f"broker {broker} advertises no InitProducerId")
    high = init[1]
    return Answer(
        high >= KIP939_INIT_PRODUCER_ID_VERSION,
        f"broker {broker} advertises InitProducerId up to v{high}, KIP-939 needs "
        f"v{KIP939_INIT_PRODUCER_ID_VERSION}",
    )


def setting_answer(settings: Mapping[str, str], unread: str | None) -> Answer:
    """Whether the broker's settings (as describe_configs gave them) turn 2PC on."""
    if unread is not None:
        return Answer(None, f"{TWO_PHASE_SETTING} could not be read: {unread}")
    value = settings.get(TWO_PHASE_SETTING)
    if value is None:
        return Answer(False, f"the broker has no setting {TWO_PHASE_SETTING}")
    return Answer(value.strip().lower() == "true", f"{TWO_PHASE_SETTING}={value}")


def client_answer(producer: type, versions: tuple[str, str]) -> Answer:
    """Whether confluent-kafka's Producer (`producer`) has a prepared-transaction API.
    `versions`: confluent-kafka's and librdkafka's."""
    python, native = versions
    has = [m for m in CLIENT_METHODS if hasattr(producer, m)]
    if has:
        return Answer(
            None,
            f"confluent-kafka {python} (librdkafka {native}) has {', '.join(has)}, which this "
            "version of durable-sinks does not know",
        )
    return Answer(
        False,
        f"confluent-kafka {python} (librdkafka {native}) has no API to prepare a transaction "
        "and complete it from another producer",
    )


class BrokerVersions:
    """The ApiVersions request, run in a thread of its own from construction: `result()`
    waits for it (its own time-out bounds the wait)."""

    def __init__(
        self,
        hosts: Sequence[tuple[str, int]],
        protocol: str,
        timeout: float,
        ask: Callable[
            [Sequence[tuple[str, int]], str, float], tuple[str, dict[int, tuple[int, int]]]
        ] = broker_api_versions,
    ) -> None:
        self._found: tuple[str, dict[int, tuple[int, int]]] | BaseException | None = None
        self._timeout = timeout * max(len(hosts), 1)

        def run() -> None:
            try:
                self._found = ask(hosts, protocol, timeout)
            except Exception as exc:  # noqa: BLE001 - reported as the unknown answer's why
                self._found = exc

        self._thread = threading.Thread(target=run, name="kip939-probe", daemon=True)
        self._thread.start()

    def result(self) -> tuple[str, dict[int, tuple[int, int]]] | BaseException:
        self._thread.join(self._timeout + 1)
        found = self._found
        return found if found is not None else TimeoutError("no answer in time")
