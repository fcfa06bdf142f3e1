"""A driver SIGKILLed in the middle of an epoch's concurrent commits (Postgres, several
sessions): some parts committed, some in flight, some not begun. The next start's recovery
commits the rest; the table holds every part's rows exactly once, nothing stays prepared."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from durable_sinks.core.naming import owner_prefix
from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint
from tests.services._layout import REPO_ROOT

PARTS = 12


def child(postgres: PostgresEndpoint, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DS_CHILD_DSN": postgres.conninfo()}
    return subprocess.run(
        [sys.executable, "-m", "tests.crash.commit_kill_child", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.parametrize("kill_after", [1, 5, PARTS - 1])
def test_a_driver_killed_amid_concurrent_commits_is_finished_by_the_next_start(
    postgres: PostgresEndpoint,
    conn: psycopg.Connection[Any],
    pg_schema: str,
    unique: UniqueNames,
    tmp_path: Path,
    kill_after: int,
) -> None:
    table, job = f"{pg_schema}.parts", f"ck-{unique.job_id[-10:]}"
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.SQL(table)))
    store = str(tmp_path / "store")
    common = (table, job, store, "--parts", str(PARTS))
    died = child(postgres, *common, "--kill-after", str(kill_after))
    assert died.returncode == -signal.SIGKILL, died.stdout + died.stderr
    count = sql.SQL("SELECT count(*), count(DISTINCT id) FROM {}").format(sql.SQL(table))
    landed = conn.execute(count).fetchone()
    assert landed is not None
    assert kill_after * 10 <= landed[0] <= PARTS * 10  # those in flight may have committed
    recovered = child(postgres, *common)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert conn.execute(count).fetchone() == (PARTS * 10, PARTS * 10)
    prefix = owner_prefix(job, "postgres") + "%"
    left = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (prefix,))
    assert left.fetchall() == []
