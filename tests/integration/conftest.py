"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.services import PostgresEndpoint


@pytest.fixture
def conn(postgres: PostgresEndpoint) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit session on the test bed's Postgres, for the test's own checks."""
    with psycopg.connect(postgres.conninfo(), autocommit=True) as connection:
        yield connection
