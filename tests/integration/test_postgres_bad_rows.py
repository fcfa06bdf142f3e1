"""Bad rows of the Postgres sink against the test bed's real Postgres: the checks made before
COPY (NOT NULL, NUL characters, varchar(n)/char(n) lengths, numeric(p,s) overflow, dates and
timestamps outside what Postgres holds) agree with the server at the exact edges; with
on_bad_rows="dead_letter" the sink leaves the refused rows out and reports each with its
reason and column, and the rest of the batch lands."""

from __future__ import annotations

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
from durable_sinks.sinks.postgres import PostgresSink, PostgresSinkConfig
from durable_sinks.sinks.postgres.columns import TableColumn, bad_values
from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint

UTC = timezone.utc
Conn = psycopg.Connection[Any]

#: (column, Postgres type, Arrow type, the last values Postgres holds, the first it does not).
EDGES = [
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


def _copy_one(conn: Conn, table: sql.Composed, name: str, array: pa.Array) -> str | None:
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
    sink = PostgresSink(PostgresSinkConfig(postgres.conninfo(), table))
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
