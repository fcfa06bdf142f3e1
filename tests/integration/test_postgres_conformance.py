"""The conformance suite against the test bed's real Postgres: the Postgres sink alone (one-phase
and two-phase, with the file decision store and with the Postgres decision store), together
with the file sink, and refusing rows (NOT NULL, NUL characters, a CHECK constraint) into a
Postgres dead-letter table.
After every example no prepared transaction of the job is left in pg_prepared_xacts."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

import psycopg
from hypothesis import strategies as st

from durable_sinks.coordinator import Coordinator
from durable_sinks.core.bad_rows import RefusalReason
from durable_sinks.manifest import DecisionStore, LocalDirectoryStore
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.testing import (
    DEAD_LETTER_COLUMNS,
    BadRows,
    Row,
    Scenario,
    Target,
    run_conformance,
)
from tests.crash.test_file_sink_conformance import check_dead_letters, check_exercised
from tests.services import PostgresEndpoint
from tests.support.targets import FileTarget, PostgresTarget
from tests.support.tiers import CONFORMANCE_SAMPLE, DEAD_LETTER_SAMPLE

#: A one-phase epoch commits the data with its decision: no commit step follows the decision.
ONE_PHASE_ABSENT = frozenset({"after-commit"})


#: The refusing table: flag NOT NULL, n a CHECK constraint (judged by the server only).
REFUSING_TABLE = (
    "key text PRIMARY KEY, n bigint CONSTRAINT n_not_negative CHECK (n >= 0), text text, "
    "x double precision, flag boolean NOT NULL"
)


def refusal(row: Row) -> RefusalReason | None:
    """What REFUSING_TABLE refuses, as the sink reports it: the checks made before the data
    is sent first, in column order (NUL in `text`, null `flag`), then the server's (CHECK)."""
    _, n, text, _, flag = row
    if text is not None and "\x00" in text:
        return RefusalReason.NUL_CHARACTER
    if flag is None:
        return RefusalReason.NOT_NULL
    if n is not None and n < 0:
        return RefusalReason.CHECK
    return None


_ints = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))
_texts = st.one_of(st.none(), st.text(max_size=6).filter(lambda t: "\x00" not in t))
_floats = st.one_of(st.none(), st.floats(allow_nan=False))
POSTGRES_BAD_ROWS = BadRows(
    refusal=refusal,
    examples=((1, "nul\x00here", 1.0, True), (2, "no flag", None, None), (-5, "neg", 0.0, False)),
    values=st.one_of(
        st.tuples(_ints, st.text(max_size=4).map(lambda t: t + "\x00"), _floats, st.booleans()),
        st.tuples(_ints, _texts, _floats, st.none()),
        st.tuples(st.integers(-(2**63), -1), _texts, _floats, st.booleans()),
    ),
)


def scenario_of(
    postgres: PostgresEndpoint,
    schema: str,
    *,
    with_files: bool = False,
    store: str = "files",
    one_phase: bool = True,
    refusing: bool = False,
) -> Callable[[], Scenario]:
    """With `refusing`, the table is REFUSING_TABLE and the job has a Postgres dead-letter
    table (created by its sink)."""

    def make() -> Scenario:
        folder = Path(tempfile.mkdtemp(prefix="ds-pg-conformance-"))
        job = f"{job_prefix(schema)}{uuid.uuid4().hex[:10]}"
        target = (
            PostgresTarget(
                postgres, schema, job, definition=REFUSING_TABLE, bad_rows=POSTGRES_BAD_ROWS
            )
            if refusing
            else PostgresTarget(postgres, schema, job)
        )
        targets: list[Target] = [target]
        if with_files:
            targets.append(FileTarget(folder / "files"))
        letters = (
            PostgresTarget(
                postgres,
                schema,
                job,
                "dead_letters",
                definition=None,
                columns=DEAD_LETTER_COLUMNS,
            )
            if refusing
            else None
        )

        def decision_store() -> DecisionStore:
            if store == "postgres":
                return PostgresDecisionStore(postgres.conninfo(), schema=schema)
            return LocalDirectoryStore(folder / "store")

        def cleanup() -> None:
            for target in [*targets, *([letters] if letters is not None else [])]:
                if isinstance(target, PostgresTarget):
                    leftovers = target.leftovers()
                    target.cleanup()
                    assert not leftovers, f"prepared transactions left behind: {leftovers}"
            shutil.rmtree(folder, ignore_errors=True)

        return Scenario(
            job,
            targets,
            decision_store,
            cleanup,
            partial(Coordinator, one_phase=one_phase),
            dead_letter=letters,
        )

    return make


def job_prefix(schema: str) -> str:
    """The start of the job ids of the scenarios writing into `schema` (one test's own): the
    other worker runs other tests of this file at the same time."""
    return f"pgconf-{schema[-10:]}-"


def prepared_count(postgres: PostgresEndpoint, schema: str) -> int:
    """Prepared transactions left by the jobs of the test writing into `schema`."""
    with psycopg.connect(postgres.conninfo()) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s",
            (f"ds:{job_prefix(schema)}%",),
        )
        return int(row.fetchone()[0])  # type: ignore[index]


def test_postgres_sink_alone(postgres: PostgresEndpoint, pg_schema: str) -> None:
    """The job's only sink: one-phase commit, the decision in the marker row (so there is no
    separate commit step to crash after)."""
    stats = run_conformance(scenario_of(postgres, pg_schema), max_examples=CONFORMANCE_SAMPLE)
    check_exercised(stats, without=ONE_PHASE_ABSENT)
    assert prepared_count(postgres, pg_schema) == 0


def test_postgres_sink_alone_two_phase(postgres: PostgresEndpoint, pg_schema: str) -> None:
    """The same sink with one-phase commit turned off: PREPARE, decision store, COMMIT
    PREPARED (what it does in every multi-sink job)."""
    stats = run_conformance(
        scenario_of(postgres, pg_schema, one_phase=False), max_examples=CONFORMANCE_SAMPLE
    )
    check_exercised(stats)
    assert prepared_count(postgres, pg_schema) == 0


def test_postgres_sink_with_postgres_decision_store(
    postgres: PostgresEndpoint, pg_schema: str
) -> None:
    stats = run_conformance(
        scenario_of(postgres, pg_schema, store="postgres"), max_examples=CONFORMANCE_SAMPLE
    )
    check_exercised(stats, without=ONE_PHASE_ABSENT)
    assert prepared_count(postgres, pg_schema) == 0


def test_postgres_and_files_in_one_job(postgres: PostgresEndpoint, pg_schema: str) -> None:
    stats = run_conformance(
        scenario_of(postgres, pg_schema, with_files=True), max_examples=CONFORMANCE_SAMPLE
    )
    check_exercised(stats)
    assert prepared_count(postgres, pg_schema) == 0


def test_postgres_refusing_rows_into_a_postgres_dead_letter(
    postgres: PostgresEndpoint, pg_schema: str
) -> None:
    """Rows the table refuses (NUL characters and nulls found before the data is sent, a
    CHECK constraint only the server judges) go to a dead-letter table in the same epoch and
    decision: after every crash and replay each row is in exactly one of the table or the dead
    letter, with its reason, and no prepared transaction is left."""
    stats = run_conformance(
        scenario_of(postgres, pg_schema, refusing=True), max_examples=DEAD_LETTER_SAMPLE
    )
    check_dead_letters(stats, {"nul_character", "not_null", "check"})
    assert prepared_count(postgres, pg_schema) == 0
