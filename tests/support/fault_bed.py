"""The faults bed as a fault test sees it: endpoints (direct and through Toxiproxy), the server
controls, the proxies, and inspection of what is left open.

Only the faults bed's servers may be stopped, crashed or killed: every other test shares the
main bed's. Fault tests take the `fault_bed` fixture (tests/conftest.py), which holds a lock
across pytest-xdist workers for the whole test, so no two of them break the servers at once,
and hands the bed over running, with every proxy enabled and no toxic.

    def test_commit_survives_a_cut(fault_bed: FaultBed) -> None:
        sink = make_sink(fault_bed.postgres_proxied.conninfo())   # the sink goes through the proxy
        with fault_bed.postgres_proxy.reset_peer():
            ...                                                    # its connections are cut
        fault_bed.postgres_server.restart("immediate", down_seconds=2)
        assert fault_bed.prepared_transactions() == []             # inspected directly
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Generic, TypeVar

from tests.services import (
    Kafka,
    KafkaEndpoint,
    KafkaTransaction,
    Postgres,
    PostgresEndpoint,
    PreparedTransaction,
    S3Endpoint,
    Testbed,
    up,
)
from tests.services._process import file_lock
from tests.services.toxiproxy import KAFKA_PROXY, POSTGRES_PROXY, S3_PROXY
from tests.support.toxiproxy import Proxy, Toxiproxy

__all__ = ["FaultBed", "Later"]

T = TypeVar("T")


class Later(Generic[T]):
    """`action` run in a thread after `delay` seconds, e.g. starting a server again while the
    code under test retries: `restart = Later(2.0, fault_bed.postgres_server.start)`.
    `result()` waits for it and returns its value or raises its exception."""

    def __init__(self, delay: float, action: Callable[[], T]) -> None:
        self.delay = delay
        self._action = action
        self._value: T | None = None
        self._error: Exception | None = None
        self.finished_at: float | None = None  # time.monotonic() when the action returned
        self._thread = threading.Thread(target=self._run, name=f"later-{action}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        time.sleep(self.delay)
        try:
            self._value = self._action()
        except Exception as exc:  # noqa: BLE001 (re-raised in the caller by result())
            self._error = exc
        self.finished_at = time.monotonic()

    def result(self, timeout: float = 300.0) -> T:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"{self._action} still running {timeout:.0f} s later")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set once the action returned


@dataclass(frozen=True)
class FaultBed:
    """Endpoints, controls and proxies of the faults bed (see the module docstring).

    `*_direct` endpoints reach the servers themselves (set-up and inspection); `*_proxied`
    ones go through Toxiproxy, whose toxics then act on them. A Kafka client bootstrapped
    through the proxy stays on it: the broker advertises the proxy's port on that listener.
    """

    testbed: Testbed
    postgres_server: Postgres  # stop(mode) / start() / restart(mode, down_seconds) / crash()
    kafka_server: Kafka  # kill() / start() / wait_transactions_ready() / transactions()
    toxiproxy: Toxiproxy
    postgres_proxy: Proxy
    kafka_proxy: Proxy
    s3_proxy: Proxy  # in front of the shared S3 server: only proxied clients are affected
    lock_file: Path

    @classmethod
    def of(cls, testbed: Testbed) -> FaultBed:
        return cls(
            testbed=testbed,
            postgres_server=testbed.faults_postgres,
            kafka_server=testbed.faults_kafka,
            toxiproxy=testbed.toxiproxy.api,
            postgres_proxy=testbed.toxiproxy.api.proxy(POSTGRES_PROXY),
            kafka_proxy=testbed.toxiproxy.api.proxy(KAFKA_PROXY),
            s3_proxy=testbed.toxiproxy.api.proxy(S3_PROXY),
            lock_file=testbed.layout.root / "faults.lock",
        )

    # -- endpoints ---------------------------------------------------------------------------
    @property
    def postgres_direct(self) -> PostgresEndpoint:
        return self.postgres_server.endpoint()

    @property
    def postgres_proxied(self) -> PostgresEndpoint:
        direct = self.postgres_direct
        return PostgresEndpoint(
            direct.host, self.testbed.layout.toxiproxy.postgres, direct.user, direct.password
        )

    @property
    def kafka_direct(self) -> KafkaEndpoint:
        return self.kafka_server.endpoint()

    @property
    def job_postgres(self) -> PostgresEndpoint:
        """What a fault test's job is given (tests/faults/jobs.py): the proxied endpoint."""
        return self.postgres_proxied

    @property
    def job_kafka(self) -> KafkaEndpoint:
        return self.kafka_proxied

    @property
    def kafka_proxied(self) -> KafkaEndpoint:
        return KafkaEndpoint(f"127.0.0.1:{self.testbed.layout.toxiproxy.kafka}")

    @property
    def s3_proxied(self) -> S3Endpoint:
        """The shared S3 server (its bucket and credentials) reached through Toxiproxy."""
        direct = self.testbed.s3.endpoint()
        return replace(direct, endpoint_url=f"http://127.0.0.1:{self.testbed.layout.toxiproxy.s3}")

    # -- per test ----------------------------------------------------------------------------
    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the faults bed for this process (a lock file shared by pytest-xdist workers):
        another worker's fault test waits until this one is done."""
        with file_lock(self.lock_file):
            yield

    def prepare(self) -> None:
        """Start whatever an earlier test left stopped or killed (Kafka: until transactions
        work), enable every proxy and remove every toxic."""
        kafka_was_down = self.kafka_server.pid() is None
        up(["faults"], self.testbed)
        if kafka_was_down:
            self.kafka_server.wait_transactions_ready()
        self.toxiproxy.reset()

    # -- inspection (direct, never through a proxy) ------------------------------------------
    def prepared_transactions(self) -> list[PreparedTransaction]:
        """`pg_prepared_xacts` of the faults Postgres, oldest first."""
        return self.postgres_server.prepared_transactions()

    def kafka_transactions(self) -> list[KafkaTransaction]:
        """Every transactional id the faults broker knows, with its state (~2-3 s: a JVM)."""
        return self.kafka_server.transactions()

    def open_kafka_transactions(self) -> list[KafkaTransaction]:
        """The faults broker's transactions still open (~2-3 s: a JVM)."""
        return self.kafka_server.open_transactions()
