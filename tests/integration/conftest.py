"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg import sql

from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint, PostgresEndpoint
from tests.support.targets import create_topic, delete_with_progress


@pytest.fixture
def admin(kafka: KafkaEndpoint) -> AdminClient:
    """A Kafka admin client on the test bed's broker."""
    return AdminClient(kafka.config())


@pytest.fixture
def progress_topic(kafka: KafkaEndpoint, unique: UniqueNames) -> Iterator[str]:
    """A progress topic name of this test's own (the sinks create it), deleted afterwards."""
    name = unique.name("progress")
    yield name
    admin = AdminClient(kafka.config())
    for future in admin.delete_topics([name], request_timeout=30).values():
        future.result(timeout=30)


@pytest.fixture
def topic(admin: AdminClient, unique: UniqueNames) -> Iterator[str]:
    """A fresh two-partition topic and, after the test, its progress topic deleted too."""
    name = unique.name("topic")
    create_topic(admin, name, 2)
    yield name
    delete_with_progress(admin, name)


@pytest.fixture
def pg_table(postgres: PostgresEndpoint, pg_schema: str) -> str:
    """`<schema>.events (id text PRIMARY KEY, n bigint, text text)` in the test's own schema:
    what the Kafka tests' `events(...)` batches fit."""
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id text PRIMARY KEY, n bigint, text text)").format(
                sql.Identifier(pg_schema, "events")
            )
        )
    return f"{pg_schema}.events"
