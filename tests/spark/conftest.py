"""The docs examples' own database, and the count of them the Spark tests report at the end
of a run."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any, cast

import psycopg
import pytest

from tests.services import PostgresEndpoint

from .test_doc_examples import RUN_PROPERTY

_counted: list[dict[str, int]] = []


@pytest.fixture
def database(postgres: PostgresEndpoint) -> Iterator[str]:
    """A database of the test's own (its name): the docs' table names and job ids are fixed,
    so each run needs a fresh place for them (the table, its markers, the decision store,
    an Iceberg SQL catalog)."""
    name = f"docs_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        for (gid,) in conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = %s", (name,)
        ).fetchall():
            # a prepared transaction holds the database; the page's own checks catch it
            with psycopg.connect(postgres.conninfo(dbname=name), autocommit=True) as there:
                there.execute(f"ROLLBACK PREPARED '{gid}'")
        with contextlib.suppress(psycopg.Error):
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed:
        _counted.extend(
            cast(dict[str, int], v) for k, v in report.user_properties if k == RUN_PROPERTY
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _counted:
        run = sum(c["run"] for c in _counted)
        skipped = sum(c["typecheck_only"] for c in _counted)
        terminalreporter.write_line(
            f"docs examples: {run} Python blocks of {len(_counted)} pages run against the "
            f"test bed ({skipped} more on those pages marked typecheck-only)"
        )
