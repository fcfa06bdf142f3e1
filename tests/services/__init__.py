"""The test bed: real Postgres, Kafka, S3 (SeaweedFS, and moto's server as a second S3
implementation) and Spark on 127.0.0.1, started by the project itself, plus the faults bed: a
second Postgres and Kafka that fault tests may restart and kill, behind Toxiproxy.

    python -m tests.services up [NAME ...]     start (idempotent), wait until each answers
    python -m tests.services status            what runs, where, pids, logs
    python -m tests.services down [NAME ...]   stop; no process is left behind
    python -m tests.services reset [NAME ...]  stop and delete the servers' data
    python -m tests.services logs NAME         where a server logs, and its last lines

NAME is one of NAMES, or `faults` for the faults bed (faults-postgres, faults-kafka and
toxiproxy). The pytest fixtures in tests/conftest.py call `up()` once per session.
docs/testbed.md describes ports, folders and versions.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ._layout import Layout
from ._process import ServiceError
from ._service import Service, Status
from .endpoints import KafkaEndpoint, PostgresEndpoint, S3Endpoint
from .kafka import FAULTS_SETTINGS as KAFKA_FAULTS_SETTINGS
from .kafka import Kafka, KafkaTransaction
from .moto import Moto
from .postgres import Postgres, PreparedTransaction
from .s3 import S3
from .spark import Spark
from .toxiproxy import Toxiproxy

__all__ = [
    "S3",
    "Kafka",
    "KafkaEndpoint",
    "KafkaTransaction",
    "Layout",
    "Moto",
    "Postgres",
    "PostgresEndpoint",
    "PreparedTransaction",
    "S3Endpoint",
    "ServiceError",
    "Spark",
    "Testbed",
    "Toxiproxy",
    "down",
    "status",
    "up",
]

NAMES = (
    "postgres",
    "kafka",
    "s3",
    "moto",
    "spark",
    "faults-postgres",
    "faults-kafka",
    "toxiproxy",
)
#: Names that stand for several servers.
GROUPS = {"faults": ("faults-postgres", "faults-kafka", "toxiproxy")}


@dataclass(frozen=True)
class Testbed:
    """All servers of one layout.

    The faults bed's Postgres and Kafka are the same classes as the main bed's, on the
    layout's `faults_layout()` (own folders under `<root>/faults/`, own ports); tests may stop,
    crash and kill those, never the main bed's, which every test shares.
    """

    __test__ = False  # not a pytest test class despite its name

    layout: Layout
    postgres: Postgres
    kafka: Kafka
    s3: S3
    moto: Moto
    spark: Spark
    faults_postgres: Postgres
    faults_kafka: Kafka
    toxiproxy: Toxiproxy

    @classmethod
    def create(cls, layout: Layout | None = None) -> Testbed:
        layout = layout or Layout.from_env()
        faults = layout.faults_layout()
        return cls(
            layout,
            Postgres(layout),
            Kafka(layout),
            S3(layout),
            Moto(layout),
            Spark(layout),
            Postgres(faults, name="faults-postgres"),
            Kafka(faults, name="faults-kafka", settings=KAFKA_FAULTS_SETTINGS),
            Toxiproxy(layout),
        )

    def select(self, names: Iterable[str] | None = None) -> list[Service]:
        chosen: list[str] = []
        for name in list(names) if names else list(NAMES):
            for member in GROUPS.get(name, (name,)):
                if member not in chosen:
                    chosen.append(member)
        unknown = [n for n in chosen if n not in NAMES]
        if unknown:
            raise ValueError(
                f"unknown service {unknown}; choose from {', '.join([*NAMES, *GROUPS])}"
            )
        services: list[Service] = [getattr(self, name.replace("-", "_")) for name in chosen]
        return services


def _each(services: list[Service], action: str) -> None:
    """Run `action` on every service concurrently; raise one error naming every failure."""
    with ThreadPoolExecutor(max_workers=len(services) or 1) as pool:
        futures = {s.name: pool.submit(getattr(s, action)) for s in services}
    failures = []
    for name, future in futures.items():
        exc = future.exception()
        if exc is not None:
            failures.append(exc if isinstance(exc, ServiceError) else ServiceError(name, repr(exc)))
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise ServiceError(
            "testbed",
            f"{len(failures)} servers failed to {action}:\n\n"
            + "\n\n".join(str(f) for f in failures),
        )


def up(names: Iterable[str] | None = None, testbed: Testbed | None = None) -> Testbed:
    """Start the chosen servers (all by default) and wait until each answers."""
    testbed = testbed or Testbed.create()
    _each(testbed.select(names), "up")
    return testbed


def down(names: Iterable[str] | None = None, testbed: Testbed | None = None) -> None:
    """Stop the chosen servers; no process of theirs is left running."""
    testbed = testbed or Testbed.create()
    _each(testbed.select(names), "down")


def status(testbed: Testbed | None = None) -> list[Status]:
    testbed = testbed or Testbed.create()
    return [s.status() for s in testbed.select()]
