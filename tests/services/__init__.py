"""The test bed: real Postgres, Kafka, S3 (SeaweedFS) and Spark on 127.0.0.1, started by the
project itself.

    python -m tests.services up [NAME ...]     start (idempotent), wait until each answers
    python -m tests.services status            what runs, where, pids, logs
    python -m tests.services down [NAME ...]   stop; no process is left behind
    python -m tests.services reset [NAME ...]  stop and delete the servers' data
    python -m tests.services logs NAME         where a server logs, and its last lines

The pytest fixtures in tests/conftest.py call `up()` once per session. docs/testbed.md
describes ports, folders and versions.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ._layout import Layout
from ._process import ServiceError
from ._service import Service, Status
from .endpoints import KafkaEndpoint, PostgresEndpoint, S3Endpoint
from .kafka import Kafka
from .postgres import Postgres
from .s3 import S3
from .spark import Spark

__all__ = [
    "S3",
    "Kafka",
    "KafkaEndpoint",
    "Layout",
    "Postgres",
    "PostgresEndpoint",
    "S3Endpoint",
    "ServiceError",
    "Spark",
    "Testbed",
    "down",
    "status",
    "up",
]

NAMES = ("postgres", "kafka", "s3", "spark")


@dataclass(frozen=True)
class Testbed:
    """All servers of one layout."""

    __test__ = False  # not a pytest test class despite its name

    layout: Layout
    postgres: Postgres
    kafka: Kafka
    s3: S3
    spark: Spark

    @classmethod
    def create(cls, layout: Layout | None = None) -> Testbed:
        layout = layout or Layout.from_env()
        return cls(layout, Postgres(layout), Kafka(layout), S3(layout), Spark(layout))

    def select(self, names: Iterable[str] | None = None) -> list[Service]:
        chosen = list(names) if names else list(NAMES)
        unknown = [n for n in chosen if n not in NAMES]
        if unknown:
            raise ValueError(f"unknown service {unknown}; choose from {', '.join(NAMES)}")
        services: list[Service] = [getattr(self, name) for name in chosen]
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
