"""An upgrade with an epoch in doubt: the previous release (built from this repository's
history, tests/upgrade/previous_release.toml) runs a job into Postgres and Kafka and is
SIGKILLed right after an epoch's decision (Kafka, the last resource, committed it with its
decision; Postgres still prepared); this release then restarts the job, same job id, and
finishes that epoch exactly once from what the previous release stored (its progress record,
decision record, commit handles, marker, fence and decision store tables), then goes on.

Driver mode without Spark (tests/upgrade/job.py, run by each release's own Python): what an
upgrade changes is the library, which a Spark driver runs the same way. About 25 s; the crash
tier (docs/testing.md, Tiers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

import durable_sinks
from durable_sinks.core.formats import interoperate
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint, PostgresEndpoint
from tests.support.kafka_reads import read_committed
from tests.support.releases import Release, previous_release, release_python
from tests.support.targets import create_topic, delete_with_progress, prepared_gids

JOB = Path(__file__).with_name("job.py")
#: The tables the job's Postgres sink and decision store create.
TABLES = (
    "durable_sinks_epochs",
    "durable_sinks_fences",
    "durable_sinks_generations",
    "durable_sinks_decisions",
)
EPOCHS = 5
IN_DOUBT = 2
ROWS = 50

pytestmark = pytest.mark.crash_tier


@pytest.fixture(scope="module")
def previous() -> Release:
    return previous_release()


@pytest.fixture(scope="module")
def previous_python(previous: Release, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return release_python(previous, tmp_path_factory.mktemp("previous-release"))


@pytest.fixture
def topic(kafka: KafkaEndpoint, unique: UniqueNames) -> Iterator[str]:
    admin = AdminClient(kafka.config())
    name = unique.name("upgrade")
    create_topic(admin, name, partitions=2)
    yield name
    delete_with_progress(admin, name)


def layout_comments(conn: psycopg.Connection[Any], schema: str) -> list[object]:
    """The comments of the tables durable-sinks made in `schema` (where a layout's version is
    kept)."""
    return [
        conn.execute(
            "SELECT obj_description(%s::regclass, 'pg_class')", (f'"{schema}"."{table}"',)
        ).fetchone()[0]  # type: ignore[index]
        for table in TABLES
    ]


def run(python: Path, state: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [str(python), str(JOB), str(state), "--epochs", str(EPOCHS), *args],
        cwd=state,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def test_this_release_finishes_an_epoch_the_previous_release_left_in_doubt(
    previous: Release,
    previous_python: Path,
    postgres: PostgresEndpoint,
    kafka: KafkaEndpoint,
    pg_schema: str,
    topic: str,
    unique: UniqueNames,
    tmp_path: Path,
) -> None:
    assert not interoperate(previous.version, durable_sinks.__version__), (
        f"release {previous.version} is recorded as the previous one, but this is "
        f"{durable_sinks.__version__} of the same MAJOR.MINOR: record the previous minor's "
        "commit in tests/upgrade/previous_release.toml"
    )
    env = {
        "UPGRADE_DSN": postgres.conninfo(),
        "UPGRADE_SCHEMA": pg_schema,
        "UPGRADE_BOOTSTRAP": kafka.bootstrap_servers,
        "UPGRADE_TOPIC": topic,
        "UPGRADE_JOB": unique.job_id,
    }
    code, output = run(previous_python, tmp_path, env, "--crash-after-decision", str(IN_DOUBT))
    assert output.startswith(f"durable-sinks {previous.version}\n"), output
    assert code == -signal.SIGKILL, f"the previous release was meant to die:\n{output}"

    # In doubt: Kafka holds the epoch (its commit is the decision), Postgres only prepared it.
    admin = AdminClient(kafka.config())
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        assert prepared_gids(conn, unique.job_id, "postgres"), "no prepared epoch left in doubt"
        keys = [r[0] for r in conn.execute(f'SELECT key FROM "{pg_schema}".events')]
        # The previous release's tables carry no layout version: this release reads them as 1.
        assert layout_comments(conn, pg_schema) == [None] * len(TABLES)
    assert sorted(keys) == sorted(f"{e}:{i}" for e in range(IN_DOUBT) for i in range(ROWS))
    assert len(read_committed(kafka, admin, topic)) == (IN_DOUBT + 1) * ROWS

    code, output = run(Path(sys.executable), tmp_path, env)
    assert output.startswith(f"durable-sinks {durable_sinks.__version__}\n"), output
    assert code == 0, output
    assert f"epoch {IN_DOUBT}: already_committed" in output, output

    expected = sorted((f"{e}:{i}", e * 1000 + i) for e in range(EPOCHS) for i in range(ROWS))
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        rows = conn.execute(f'SELECT key, n FROM "{pg_schema}".events').fetchall()
        assert not prepared_gids(conn, unique.job_id, "postgres")
    assert sorted((str(k), int(n)) for k, n in rows) == expected
    landed = [
        ((m.key() or b"").decode(), json.loads(m.value() or b"")["n"])
        for m in read_committed(kafka, admin, topic)
    ]
    assert sorted(landed) == expected
