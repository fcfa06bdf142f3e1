"""docs/quickstart.md as a reader follows it: its job (the page's `quickstart.py` block) is
started as a process against the test bed's Postgres, SIGKILLed mid-stream with its JVM,
started again from the same checkpoint, and killed again; the page's own count then finds
every value of the rate source from 0 up exactly once, more of them than the first run
wrote."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.services import PostgresEndpoint
from tests.services.spark import SHORT_LIVED_JVM
from tests.support import doc_examples

from .test_doc_examples import RUN_PROPERTY

PAGE = doc_examples.ROOT / "docs" / "quickstart.md"


def rows(dsn: str) -> int:
    try:
        with psycopg.connect(dsn) as conn:
            found = conn.execute("SELECT count(*) FROM quickstart").fetchone()
    except psycopg.errors.UndefinedTable:
        return 0
    return int(found[0]) if found else 0


def run_until(script: Path, env: dict[str, str], log: Path, dsn: str, more_than: int) -> int:
    """Start the job, wait until the table holds more than `more_than` rows, SIGKILL the
    job's process group (Python and its JVM) and return the rows counted before the kill."""
    with log.open("ab") as out:
        job = subprocess.Popen(
            [sys.executable, str(script)],
            cwd=script.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while (count := rows(dsn)) <= more_than:
            assert job.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.5)
        return count
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)


@pytest.mark.timeout(420)
def test_the_quickstart_job_killed_and_restarted_writes_every_value_once(
    postgres: PostgresEndpoint,
    database: str,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    found = doc_examples.blocks(PAGE)
    (script_block,) = [b for b in found if b.file]
    assert script_block.file == "quickstart.py"
    script = tmp_path / script_block.file
    script.write_text(script_block.code)
    dsn = postgres.conninfo(dbname=database)
    env = {
        **os.environ,
        "DSN": dsn,
        "CHECKPOINT": str(tmp_path / "checkpoint"),
        "PYSPARK_PYTHON": sys.executable,
        # what the test bed's own drivers get (tests/services/spark.py): a short-lived JVM
        # starts faster with the client compiler only, and no web UI
        "PYSPARK_SUBMIT_ARGS": (
            f"--driver-java-options {SHORT_LIVED_JVM} --conf spark.ui.enabled=false pyspark-shell"
        ),
    }
    log = tmp_path / "quickstart.log"
    started = time.monotonic()
    first = run_until(script, env, log, dsn, more_than=100)  # a few batches
    second = run_until(script, env, log, dsn, more_than=rows(dsn) + 100)
    print(f"quickstart: {first} rows, then {second}, in {time.monotonic() - started:.0f} s")
    assert second > first

    # the page's count, as a reader runs it
    namespace: dict[str, Any] = {"__name__": "__doc_example__", "dsn": dsn}
    checks = [b for b in found if not b.file]
    for block in checks:
        code = compile("\n" * (block.line - 1) + block.code, str(PAGE), "exec")
        exec(code, namespace)  # noqa: S102 (the page's own example)
    count, distinct, expected = namespace["row"]
    assert count == distinct == expected >= second, (count, distinct, expected)
    record_property(RUN_PROPERTY, {"run": len(found), "typecheck_only": 0})
