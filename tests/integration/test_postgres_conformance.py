"""The conformance suite against the test bed's real Postgres: the Postgres sink alone (one-phase
and two-phase, with the file decision store and with the Postgres decision store) and together
with the file sink.
After every example no prepared transaction of the job is left in pg_prepared_xacts."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

import psycopg

from durable_sinks.coordinator import Coordinator
from durable_sinks.manifest import DecisionStore, LocalDirectoryStore
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.testing import Scenario, Target, run_conformance
from tests.crash.test_file_sink_conformance import check_exercised
from tests.services import PostgresEndpoint
from tests.support.targets import FileTarget, PostgresTarget
from tests.support.tiers import CONFORMANCE_SAMPLE

#: A one-phase epoch commits the data with its decision: no commit step follows the decision.
ONE_PHASE_ABSENT = frozenset({"after-commit"})


def scenario_of(
    postgres: PostgresEndpoint,
    schema: str,
    *,
    with_files: bool = False,
    store: str = "files",
    one_phase: bool = True,
) -> Callable[[], Scenario]:
    def make() -> Scenario:
        folder = Path(tempfile.mkdtemp(prefix="ds-pg-conformance-"))
        job = f"pgconf-{uuid.uuid4().hex[:10]}"
        targets: list[Target] = [PostgresTarget(postgres, schema, job)]
        if with_files:
            targets.append(FileTarget(folder / "files"))

        def decision_store() -> DecisionStore:
            if store == "postgres":
                return PostgresDecisionStore(postgres.conninfo(), schema=schema)
            return LocalDirectoryStore(folder / "store")

        def cleanup() -> None:
            for target in targets:
                if isinstance(target, PostgresTarget):
                    leftovers = target.leftovers()
                    target.cleanup()
                    assert not leftovers, f"prepared transactions left behind: {leftovers}"
            shutil.rmtree(folder, ignore_errors=True)

        return Scenario(
            job, targets, decision_store, cleanup, partial(Coordinator, one_phase=one_phase)
        )

    return make


def prepared_count(postgres: PostgresEndpoint) -> int:
    with psycopg.connect(postgres.conninfo()) as conn:
        row = conn.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE 'ds:pgconf-%'")
        return int(row.fetchone()[0])  # type: ignore[index]


def test_postgres_sink_alone(postgres: PostgresEndpoint, pg_schema: str) -> None:
    """The job's only sink: one-phase commit, the decision in the marker row (so there is no
    separate commit step to crash after)."""
    stats = run_conformance(scenario_of(postgres, pg_schema), max_examples=CONFORMANCE_SAMPLE)
    check_exercised(stats, without=ONE_PHASE_ABSENT)
    assert prepared_count(postgres) == 0


def test_postgres_sink_alone_two_phase(postgres: PostgresEndpoint, pg_schema: str) -> None:
    """The same sink with one-phase commit turned off: PREPARE, decision store, COMMIT
    PREPARED (what it does in every multi-sink job)."""
    stats = run_conformance(
        scenario_of(postgres, pg_schema, one_phase=False), max_examples=CONFORMANCE_SAMPLE
    )
    check_exercised(stats)
    assert prepared_count(postgres) == 0


def test_postgres_sink_with_postgres_decision_store(
    postgres: PostgresEndpoint, pg_schema: str
) -> None:
    stats = run_conformance(
        scenario_of(postgres, pg_schema, store="postgres"), max_examples=CONFORMANCE_SAMPLE
    )
    check_exercised(stats, without=ONE_PHASE_ABSENT)
    assert prepared_count(postgres) == 0


def test_postgres_and_files_in_one_job(postgres: PostgresEndpoint, pg_schema: str) -> None:
    stats = run_conformance(
        scenario_of(postgres, pg_schema, with_files=True), max_examples=CONFORMANCE_SAMPLE
    )
    check_exercised(stats)
    assert prepared_count(postgres) == 0
