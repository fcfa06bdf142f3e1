"""The simulation's servers (the test bed's, with a progress topic of the test's own), and the
summary of the cases run: each exhaustive test records its shape's counts (a user property,
which reaches the controller from pytest-xdist's workers too), printed at the end of the run."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka.admin import AdminClient

from tests.services import KafkaEndpoint, PostgresEndpoint, S3Endpoint
from tests.simulation.world import Servers
from tests.support.targets import create_topic


@pytest.fixture
def servers(
    postgres: PostgresEndpoint,
    pg_schema: str,
    kafka: KafkaEndpoint,
    s3: S3Endpoint,
    tmp_path: Path,
) -> Iterator[Servers]:
    admin = AdminClient(kafka.config())
    progress = f"sim-progress-{uuid.uuid4().hex[:10]}"
    create_topic(admin, progress, 1, **{"cleanup.policy": "compact"})
    yield Servers(postgres, pg_schema, kafka, admin, progress, s3, tmp_path)
    for future in admin.delete_topics([progress], request_timeout=30).values():
        future.result(timeout=30)


#: The user property an exhaustive test records its counts under.
CASES_PROPERTY = "simulation-cases"
_counted: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _counted.extend(
            cast(dict[str, Any], v) for k, v in report.user_properties if k == CASES_PROPERTY
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _counted:
        return
    write = terminalreporter.write_line
    terminalreporter.section("the ambiguity simulation: cases by shape and kind")
    for found in sorted(_counted, key=lambda f: str(f["shape"])):
        counts: dict[str, int] = found["counts"]
        write(f"{found['shape']}: {sum(counts.values())} cases")
        for kind, count in sorted(counts.items()):
            write(f"  {count:6d}  {kind}")
    write(f"all shapes: {sum(sum(f['counts'].values()) for f in _counted)} cases")
