"""Bad rows of the Postgres sink against the test bed's real Postgres: the checks made before
COPY (NOT NULL, NUL characters, varchar(n)/char(n) lengths, numeric(p,s) overflow, dates and
timestamps outside what Postgres holds) agree with the server at the exact edges; with
on_bad_rows="dead_letter" the sink leaves the refused rows out and reports each with its
reason and column, and the rest of the batch lands."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pgpq
import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from durable_sinks.core import OpenContext
from durable_sinks.core.bad_rows import BadRowPolicy, RefusalReason, WritePolicy
from durable_sinks.core.errors import ConfigError
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from durable_sinks.sinks.postgres.columns import TableColumn, bad_values
from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint
from tests.support.pg_access import Role

UTC = timezone.utc
Conn = psycopg.Connection[Any]

#: (column, Postgres type, Arrow type, the last values Postgres holds, the first it does not).
#: (column, Postgres type, Arrow type, the last values Postgres holds, the first it does not)
EDGES: list[tuple[str, str, pa.DataType, list[Any], list[Any]]] = [
    ("d", "date", pa.date32(), [-2_440_588, 2_145_042_905], [-2_440_589, 2_145_042_906]),
    (
        "d_min",
        "date",
        pa.date32(),
        [],
        # Lands on Postgres's -infinity once pgpq shifts it to 2000-01-01.
        [-(2**31) + 10_957],
    ),
    (
        "ts_s",
        "timestamp",
        pa.timestamp("s"),
        [-210_866_803_200, 9_224_318_015_999],
        [-210_866_803_201, 9_224_318_016_000],
    ),
    (
        "ts_ms",
        "timestamptz",
        pa.timestamp("ms", "UTC"),
        [-210_866_803_200_000, 9_224_318_015_999_999],
        [-210_866_803_200_001, 9_224_318_016_000_000],
    ),
    (
        "ts_us",
        "timestamptz",
        pa.timestamp("us", "UTC"),
        [-210_866_803_200_000_000, 2**63 - 1],
        [-210_866_803_200_000_001, -(2**63) + 946_684_800_000_000],
    ),
    (
        "n",
        "numeric(5,2)",
        pa.decimal128(7, 2),
        [Decimal("999.99"), Decimal("-999.99")],
        [Decimal("1000.00"), Decimal("-1000.00")],
    ),
    ("v", "varchar(3)", pa.string(), ["äöü", "ab ", "abc  "], ["abcd", "ab c"]),
    ("c", "char(2)", pa.string(), ["é", "ab   "], ["abc"]),
    ("t", "text", pa.string(), ["a\x01b"], ["a\x00b"]),
]


def _copy_one(conn: Conn, table: sql.Identifier, name: str, array: pa.Array) -> str | None:
    """COPY one value, bypassing the sink's checks: None when Postgres took it as a finite
    value, else what went wrong (pgpq's encoding, the server, or an infinity stored)."""
    batch = pa.record_batch({name: array})
    encoder = pgpq.ArrowToPostgresBinaryEncoder(batch.schema)
    try:
        data = encoder.write_header() + encoder.write_batch(batch) + encoder.finish()
    except ValueError as exc:
        return f"pgpq: {exc}"
    try:
        with conn.transaction(), conn.cursor() as cur:
            with cur.copy(
                sql.SQL("COPY {} ({}) FROM STDIN (FORMAT binary)").format(
                    table, sql.Identifier(name)
                )
            ) as copy:
                copy.write(data)
            stored = cur.execute(
                sql.SQL("SELECT {}::text FROM {}").format(sql.Identifier(name), table)
            ).fetchone()
            cur.execute(sql.SQL("DELETE FROM {}").format(table))
    except psycopg.Error as exc:
        return f"server: {exc.sqlstate}"
    assert stored is not None
    return f"stored {stored[0]}" if "infinity" in str(stored[0]) else None


def test_the_checks_before_copy_agree_with_postgres_at_the_edges(
    conn: Conn, pg_schema: str
) -> None:
    """Each last value Postgres holds is written intact and not refused; each first value it
    does not hold fails when sent unchecked and is refused by the checks."""
    for name, pg_type, arrow_type, good, bad in EDGES:
        table = sql.Identifier(pg_schema, f"edge_{name}")
        conn.execute(
            sql.SQL("CREATE TABLE {} ({} {})").format(table, sql.Identifier(name), sql.SQL(pg_type))
        )
        formatted = conn.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attname = %s",
            (f'"{pg_schema}"."edge_{name}"', name),
        ).fetchone()
        assert formatted is not None
        columns = {name: TableColumn(name, formatted[0], not_null=False, has_default=False)}
        for value in good:
            array = pa.array([value], arrow_type)
            assert _copy_one(conn, table, name, array) is None, (name, value)
            assert not bad_values(pa.record_batch({name: array}), columns), (name, value)
        for value in bad:
            array = pa.array([value], arrow_type)
            assert _copy_one(conn, table, name, array) is not None, (name, value)
            refused = bad_values(pa.record_batch({name: array}), columns)
            assert refused.rows == (0,), (name, value)
            assert refused.refusals[0].column == name


def test_dead_letter_mode_leaves_refused_rows_out_and_names_each(
    postgres: PostgresEndpoint, conn: Conn, pg_schema: str, unique: UniqueNames
) -> None:
    table = f"{pg_schema}.events"
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint NOT NULL, name varchar(4) NOT NULL, note text, "
            "amount numeric(4,1), day date, at timestamptz)"
        ).format(sql.Identifier(pg_schema, "events"))
    )
    sink = PostgresSink(Postgres(postgres.conninfo(), table))
    policy = WritePolicy(on_bad_rows=BadRowPolicy.DEAD_LETTER)
    sink.open(OpenContext(unique.job_id, "postgres", 1, commit_point=True, policy=policy))
    try:
        sink.begin_epoch(0)
        ok_at = datetime(2026, 1, 1, tzinfo=UTC)
        batch = pa.record_batch(
            {
                "id": pa.array(range(7), pa.int64()),
                "name": ["ok", None, "long!", "ok", "ok", "ok", "fine"],
                "note": ["", "x", "y", "a\x00", "z", "z", None],
                "amount": pa.array(
                    [Decimal("1.5"), None, None, None, Decimal("1000.0"), None, Decimal("-999.9")],
                    pa.decimal128(6, 1),
                ),
                "day": pa.array([date(2026, 1, 1)] * 5 + [None, date(2026, 1, 2)], pa.date32()),
                "at": pa.array(
                    [ok_at] * 5 + [datetime(1, 1, 1, tzinfo=UTC), ok_at],
                    pa.timestamp("us", "UTC"),
                ),
            }
        )
        # Row 5's timestamp is fine (year 1): only rows 1-4 are refused.
        result = sink.write_batch(batch)
        assert result.rows == 3
        assert result.refused.rows == (1, 2, 3, 4)
        assert [(r.reason, r.column) for r in result.refused.refusals] == [
            (RefusalReason.NOT_NULL, "name"),
            (RefusalReason.TOO_LONG, "name"),
            (RefusalReason.NUL_CHARACTER, "note"),
            (RefusalReason.OUT_OF_RANGE, "amount"),
        ]
        handle = sink.pre_commit(0)
        sink.commit_with_decision(0, handle, {"epoch": 0})
    finally:
        sink.close()
    ids = conn.execute(
        sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(pg_schema, "events"))
    ).fetchall()
    assert [r[0] for r in ids] == [0, 5, 6]


@pytest.mark.parametrize("unit", ["s", "ms"])
def test_timestamps_past_what_postgres_holds_are_refused_not_wrapped(unit: str) -> None:
    """Far past the edges (where pgpq's shift to microseconds would overflow), values are
    refused by the check instead of failing the whole batch in the encoder."""
    columns = {"at": TableColumn("at", "timestamp with time zone", False, False)}
    array = pa.array([0, 2**63 - 1, -(2**63), None], pa.timestamp(unit, "UTC"))
    refused = bad_values(pa.record_batch({"at": array}), columns)
    assert refused.rows == (1, 2)
    assert {r.reason for r in refused.refusals} == {RefusalReason.TIMESTAMP_OUT_OF_RANGE}


# -- what only the server knows -----------------------------------------------------------------
def server_judged_table(conn: Conn, schema: str) -> sql.Identifier:
    """`schema.children`: a primary key, a deferred foreign key, a check, an exclusion
    constraint and a trigger that raises (its message holding a password-like pair) or divides
    by zero; row 100 already there."""
    parents = sql.Identifier(schema, "parents")
    children = sql.Identifier(schema, "children")
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY)").format(parents))
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1), (2)").format(parents))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {c} (id bigint PRIMARY KEY, parent bigint CONSTRAINT child_parent "
            "REFERENCES {p} (id) DEFERRABLE INITIALLY DEFERRED, score int CONSTRAINT "
            "score_positive CHECK (score > 0), code text, note text, "
            "CONSTRAINT one_code EXCLUDE USING btree (code WITH =))"
        ).format(c=children, p=parents)
    )
    conn.execute(
        sql.SQL(
            "CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.note = 'boom' THEN RAISE EXCEPTION 'no boom here (password=hunter2)'; "
            "END IF; PERFORM 1 / (NEW.score - 7); RETURN NEW; END $$"
        ).format(f=sql.Identifier(schema, "guard"))
    )
    conn.execute(
        sql.SQL(
            "CREATE TRIGGER guard BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}()"
        ).format(children, sql.Identifier(schema, "guard"))
    )
    conn.execute(sql.SQL("INSERT INTO {} VALUES (100, 1, 1, 'old', '')").format(children))
    return children


#: row -> (id, parent, score, code, note) for a batch whose bad rows each break one rule.
SERVER_ROWS = {
    0: (1, 1, 1, "a", ""),
    1: (2, 9, 1, "b", ""),  # foreign key
    2: (3, 1, -1, "c", ""),  # check
    3: (100, 1, 1, "d", ""),  # primary key, already in the table
    4: (4, 2, 1, "a", ""),  # exclusion (code 'a' again)
    5: (5, 1, 1, "e", "boom"),  # the trigger raises
    6: (6, 1, 7, "f", ""),  # the trigger divides by zero
    7: (7, 2, 1, "g", ""),
    8: (1, 2, 1, "h", ""),  # primary key, twice in the batch
    9: (8, 8, 1, "i", ""),  # foreign key
}
SERVER_REFUSED = {
    1: (RefusalReason.FOREIGN_KEY, "child_parent"),
    2: (RefusalReason.CHECK, "score_positive"),
    3: (RefusalReason.UNIQUE, "children_pkey"),
    4: (RefusalReason.EXCLUSION, "one_code"),
    5: (RefusalReason.REFUSED, None),
    6: (RefusalReason.INVALID_VALUE, None),
    8: (RefusalReason.UNIQUE, "children_pkey"),
    9: (RefusalReason.FOREIGN_KEY, "child_parent"),
}


def server_batch(rows: dict[int, tuple[Any, ...]]) -> pa.RecordBatch:
    values = list(zip(*rows.values(), strict=True))
    return pa.record_batch(
        {
            "id": pa.array(values[0], pa.int64()),
            "parent": pa.array(values[1], pa.int64()),
            "score": pa.array(values[2], pa.int32()),
            "code": pa.array(values[3], pa.string()),
            "note": pa.array(values[4], pa.string()),
        }
    )


@pytest.mark.parametrize(
    ("one_phase", "staged"),
    [(True, True), (False, True), (False, False)],
    ids=["one-phase", "two-phase", "two-phase-without-create-on-the-schema"],
)
def test_rows_the_server_refuses_are_isolated_inside_the_epoch(
    one_phase: bool,
    staged: bool,
    postgres: PostgresEndpoint,
    conn: Conn,
    pg_schema: str,
    unique: UniqueNames,
    roles: Callable[..., Role],
) -> None:
    """Each row breaking a key, a (deferred) foreign key, a check, an exclusion constraint or
    a trigger is refused alone, with its reason, constraint and the server's message (secrets
    masked); the other rows land, once, in the same transaction. Without CREATE on the
    table's schema (no staging table) the rows are found by COPYing pieces again."""
    children = server_judged_table(conn, pg_schema)
    dsn, options = postgres.conninfo(), dict[str, Any]()
    if not staged:
        role = roles(create=False)
        role.grant_table("children", "SELECT, INSERT")
        meta = f"{pg_schema}_meta"
        conn.execute(
            sql.SQL("CREATE SCHEMA {m}; GRANT USAGE, CREATE ON SCHEMA {m} TO {r}").format(
                m=sql.Identifier(meta), r=sql.Identifier(role.name)
            )
        )
        dsn, options = role.dsn(), {"meta_schema": meta}
    sink = PostgresSink(Postgres(dsn, f"{pg_schema}.children", **options))
    policy = WritePolicy(on_bad_rows=BadRowPolicy.DEAD_LETTER)
    sink.open(OpenContext(unique.job_id, "postgres", 1, commit_point=one_phase, policy=policy))
    try:
        sink.begin_epoch(0)
        result = sink.write_batch(server_batch(SERVER_ROWS))
        assert result.rows == 2
        found = {
            row: (refusal.reason, refusal.constraint)
            for row, refusal in zip(result.refused.rows, result.refused.refusals, strict=True)
        }
        assert found == SERVER_REFUSED
        messages = dict(zip(result.refused.rows, result.refused.refusals, strict=True))
        assert messages[5].message == "no boom here (password=***) (SQLSTATE P0001)"
        assert messages[6].message == "division by zero (SQLSTATE 22012)"
        assert "violates foreign key constraint" in messages[1].message
        # A second batch in the same epoch, after refusals: its rows land too.
        later = sink.write_batch(server_batch({0: (9, 1, 2, "j", ""), 1: (10, 1, -5, "k", "")}))
        assert (later.rows, later.refused.rows) == (1, (1,))
        handle = sink.pre_commit(0)
        if one_phase:
            sink.commit_with_decision(0, handle, {"epoch": 0})
        else:
            sink.commit_epoch(0, handle)
        assert handle.rows == 3
    finally:
        sink.close()
    ids = conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(children)).fetchall()
    assert [r[0] for r in ids] == [1, 7, 9, 100]
    copies = sink.metrics()["isolation_copies"]
    assert copies > 0 if staged else copies > 5  # pieces COPYed again without a stage
    if not staged:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(f"{pg_schema}_meta")))


def test_upsert_with_dead_letters_is_refused_at_open(
    postgres: PostgresEndpoint, conn: Conn, pg_schema: str, unique: UniqueNames
) -> None:
    conn.execute(
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY)").format(
            sql.Identifier(pg_schema, "users")
        )
    )
    sink = PostgresSink(
        Postgres(postgres.conninfo(), f"{pg_schema}.users", mode="upsert", key=("id",))
    )
    policy = WritePolicy(on_bad_rows=BadRowPolicy.DEAD_LETTER)
    with pytest.raises(ConfigError, match="not supported with mode='upsert'") as raised:
        sink.open(OpenContext(unique.job_id, "postgres", 1, policy=policy))
    assert "mode='append'" in (raised.value.fix or "")
    sink.close()


def test_nul_characters_are_found_in_a_slice_of_a_larger_batch_and_only_there() -> None:
    """Batches sliced from one Arrow table share its buffers: the raw-byte scan reads only
    the slice's own bytes."""
    columns = {"t": TableColumn("t", "text", False, False)}
    whole = pa.record_batch({"t": pa.array(["ab", "c\x00d", "ef", None, "g\x00"])})
    assert bad_values(whole.slice(2, 2), columns).rows == ()
    assert bad_values(whole.slice(1, 3), columns).rows == (0,)
    assert bad_values(whole.slice(3), columns).rows == (1,)
    assert bad_values(whole.slice(5), columns).rows == ()


def test_a_key_is_free_when_its_first_row_was_refused_for_another_reason(
    postgres: PostgresEndpoint, conn: Conn, pg_schema: str, unique: UniqueNames
) -> None:
    """As a COPY would: a row refused by a check does not take its key, so the next row with
    that key lands; the later of two rows with one key is refused, and a key already in the
    table too."""
    table = sql.Identifier(pg_schema, "scores")
    conn.execute(
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, score int CHECK (score > 0))").format(
            table
        )
    )
    conn.execute(sql.SQL("INSERT INTO {} VALUES (9, 9)").format(table))
    sink = PostgresSink(Postgres(postgres.conninfo(), f"{pg_schema}.scores"))
    policy = WritePolicy(on_bad_rows=BadRowPolicy.DEAD_LETTER)
    sink.open(OpenContext(unique.job_id, "postgres", 1, commit_point=True, policy=policy))
    try:
        sink.begin_epoch(0)
        result = sink.write_batch(
            pa.record_batch(
                {
                    "id": pa.array([1, 1, 2, 2, 9, 3], pa.int64()),
                    "score": pa.array([-1, 1, 2, 3, 1, 4], pa.int32()),
                }
            )
        )
        assert [
            (r, f.reason) for r, f in zip(result.refused.rows, result.refused.refusals, strict=True)
        ] == [
            (0, RefusalReason.CHECK),
            (3, RefusalReason.UNIQUE),
            (4, RefusalReason.UNIQUE),
        ]
        sink.commit_with_decision(0, sink.pre_commit(0), {"epoch": 0})
    finally:
        sink.close()
    found = conn.execute(sql.SQL("SELECT id, score FROM {} ORDER BY id").format(table)).fetchall()
    assert found == [(1, 1), (2, 2), (3, 4), (9, 9)]
