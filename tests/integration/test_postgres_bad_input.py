"""Misuse and bad input of the Postgres sink against the test bed's real Postgres:
typed columns (numeric(p,s), varchar(n), char(n), timestamp(p)) accepted with their values
intact or refused before COPY where Postgres would silently change them; values the columns
cannot take (too long, out of range) refused before COPY as BadRowsError naming the column and
row; what only the server can judge (a key already there, a constraint) refused as
SchemaMismatchError naming the column, row, constraint or key with a fix; duplicate keys of an
upsert epoch named; missing schemas refused at start before anything is created; connection
failures split into ConfigError (the server refused the DSN) and UnreachableError.

Every refusal is checked for its type, message, fix and epoch, and for what it left: no rows,
no prepared transaction of the test's job, no table or schema created."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from durable_sinks import UnreachableError
from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core import OpenContext
from durable_sinks.core.bad_rows import BadRowsError
from durable_sinks.core.errors import ConfigError, SchemaMismatchError, TransientError
from durable_sinks.manifest import LocalDirectoryStore, default_store_for
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint
from tests.support.targets import prepared_gids

UTC = timezone.utc

Conn = psycopg.Connection[Any]


# -- helpers -----------------------------------------------------------------------------------
def make_table(conn: Conn, schema: str, name: str, columns: str) -> str:
    conn.execute(
        sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(schema, name), sql.SQL(columns))
    )
    return f"{schema}.{name}"


def rows(conn: Conn, table: str) -> list[tuple[Any, ...]]:
    schema, name = table.split(".")
    query = sql.SQL("SELECT * FROM {} ORDER BY 1").format(sql.Identifier(schema, name))
    return [tuple(r) for r in conn.execute(query).fetchall()]


def tables_in(conn: Conn, schema: str) -> list[str]:
    found = conn.execute(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)
    ).fetchall()
    return [r[0] for r in found]


def schema_exists(conn: Conn, schema: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        is not None
    )


def coordinator_for(
    postgres: PostgresEndpoint,
    table: str,
    job_id: str,
    tmp_path: Path,
    *,
    one_phase: bool = True,
    **options: Any,
) -> Coordinator:
    """A started one-sink job (one-phase by default; two-phase as in any multi-sink job)."""
    sink = PostgresSink(Postgres(postgres.conninfo(), table, **options))
    coordinator = Coordinator(
        job_id, [sink], LocalDirectoryStore(tmp_path / "store"), one_phase=one_phase
    )
    coordinator.start()
    return coordinator


def assert_nothing_landed(
    conn: Conn, coordinator: Coordinator, table: str, job_id: str, before: list[Any]
) -> None:
    assert rows(conn, table) == before
    assert prepared_gids(conn, job_id, "postgres") == []
    assert coordinator.decision(0) is None
    schema = table.split(".")[0]
    assert [t for t in tables_in(conn, schema) if t.startswith("ds_stage_")] == []


PHASES = pytest.mark.parametrize("one_phase", [True, False], ids=["one-phase", "two-phase"])


# -- typed columns: accepted with their values -------------------------------------------------
TYPED = (
    "id bigint PRIMARY KEY, amount numeric(10,2), name varchar(10), code char(3), "
    "at timestamp(3) with time zone, took interval day to second"
)


def typed_batch(**overrides: pa.Array) -> pa.RecordBatch:
    columns: dict[str, pa.Array] = {
        "id": pa.array([1, 2], pa.int64()),
        "amount": pa.array([Decimal("12345678.91"), Decimal("-0.05")], pa.decimal128(10, 2)),
        "name": pa.array(["ten chars!", "ü"], pa.string()),
        "code": pa.array(["ab", "xyz"], pa.string()),
        "at": pa.array(
            [datetime(2026, 1, 2, 3, 4, 5, 123000, tzinfo=UTC)] * 2,
            pa.timestamp("us", "UTC"),
        ),
        "took": pa.array([timedelta(days=1, seconds=5, microseconds=7)] * 2, pa.duration("us")),
    }
    columns.update(overrides)
    return pa.record_batch(columns)


@PHASES
def test_typed_columns_take_decimals_and_strings_with_their_values(
    one_phase: bool,
    postgres: PostgresEndpoint,
    conn: Conn,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
) -> None:
    table = make_table(conn, pg_schema, "typed", TYPED)
    coordinator = coordinator_for(postgres, table, job_id, tmp_path, one_phase=one_phase)
    # decimal(10,2) into numeric(10,2) and a smaller scale (decimal(6,1)) both fit exactly.
    narrower = pa.array([Decimal("1.5")], pa.decimal128(6, 1))
    batches = [
        typed_batch(),
        typed_batch(
            id=pa.array([3], pa.int64()),
            amount=narrower,
            name=pa.array([None], pa.string()),
            code=pa.array(["q"], pa.string()),
            at=pa.array([None], pa.timestamp("us", "UTC")),
            took=pa.array([None], pa.duration("us")),
        ),
    ]
    assert coordinator.run_epoch(0, batches).outcome is EpochOutcome.COMMITTED
    at = datetime(2026, 1, 2, 3, 4, 5, 123000, tzinfo=UTC)
    took = timedelta(days=1, seconds=5, microseconds=7)
    assert rows(conn, table) == [
        (1, Decimal("12345678.91"), "ten chars!", "ab ", at, took),
        (2, Decimal("-0.05"), "ü", "xyz", at, took),
        (3, Decimal("1.50"), None, "q  ", None, None),
    ]
    assert prepared_gids(conn, job_id, "postgres") == []


# -- typed columns: refused before COPY where Postgres would change the values -----------------
TYPE_REFUSALS = {
    "decimal scale above the column's": (
        {"amount": pa.array([Decimal("1.2345")], pa.decimal128(12, 4))},
        "column 'amount' is numeric(10,2) in the table but the batch has Arrow "
        "decimal128(12, 4) (Spark decimal(12,4)): Postgres would round its values to 2 "
        "decimal places",
        'col("amount").cast("decimal(10,2)"), or alter the column to numeric(12,4)',
    ),
    "interval fields coarser than seconds": (
        {"took": pa.array([timedelta(hours=25)], pa.duration("us"))},
        "column 'took' is interval day in the table but the batch has Arrow duration[us] "
        "(durations, sent as microseconds): Postgres would cut its values down to whole days",
        "alter column 'took' to interval",
    ),
    "another type altogether": (
        {"id": pa.array([5], pa.int32())},
        "column 'id' is bigint in the table but the batch has Arrow int32, which the sink "
        "writes as integer",
        'cast it in Spark: col("id").cast("bigint")',
    ),
    "text into numeric": (
        {"amount": pa.array(["1.50"], pa.string())},
        "column 'amount' is numeric(10,2) in the table but the batch has Arrow string, which "
        "the sink writes as text",
        'col("amount").cast("decimal(10,2)")',
    ),
}


@pytest.mark.parametrize("case", sorted(TYPE_REFUSALS))
def test_typed_columns_that_would_change_values_are_refused_before_copy(
    case: str, postgres: PostgresEndpoint, conn: Conn, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    columns, message, fix = TYPE_REFUSALS[case]
    table = make_table(
        conn, pg_schema, "typed", "id bigint PRIMARY KEY, amount numeric(10,2), took interval day"
    )
    batch = pa.record_batch({"id": pa.array([5], pa.int64()), **columns})
    coordinator = coordinator_for(postgres, table, job_id, tmp_path, one_phase=False)
    with pytest.raises(SchemaMismatchError) as raised:
        coordinator.run_epoch(0, [batch])
    error = raised.value
    assert message in error.message
    assert "(encoded as" not in error.message
    assert fix in (error.fix or "")
    assert (error.job, error.sink, error.epoch) == (job_id, "postgres", 0)
    assert coordinator.sinks[0].metrics()["bytes"] == 0  # refused before any COPY
    assert_nothing_landed(conn, coordinator, table, job_id, [])


# -- values the table's columns cannot take: refused before COPY ------------------------------
VALUE_REFUSALS = {
    "string longer than varchar(n)": (
        {"name": pa.array(["short", "eleven char"], pa.string())},
        "too_long (column 'name'): 1 row (first: row 1: value too long for type character "
        "varying(10)",
        'substring(col("name"), 1, <n>)',
    ),
    "string longer than char(n)": (
        {"code": pa.array(["abcd", "a"], pa.string())},
        "too_long (column 'code'): 1 row (first: row 0: value too long for type character(3)",
        'substring(col("code"), 1, <n>)',
    ),
    "number too large for numeric(p,s)": (
        {"amount": pa.array([Decimal("1.00"), Decimal("123456789.00")], pa.decimal128(12, 2))},
        "out_of_range (column 'amount'): 1 row (first: row 1: numeric field overflow: a field "
        "with precision 10, scale 2 must round to an absolute value less than 10^8)",
        "ALTER TABLE",
    ),
    "timestamp out of range": (
        {"at": pa.array([0, -(2**62)], pa.timestamp("us", "UTC"))},
        "timestamp_out_of_range (column 'at'): 1 row (first: row 1: timestamp out of range",
        "filter or fix the out-of-range values of 'at'",
    ),
}


@pytest.mark.parametrize("mode", ["append", "upsert"])
@pytest.mark.parametrize("case", sorted(VALUE_REFUSALS))
def test_values_the_columns_cannot_take_are_refused_before_copy_naming_column_and_row(
    case: str,
    mode: str,
    postgres: PostgresEndpoint,
    conn: Conn,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
) -> None:
    columns, message, fix = VALUE_REFUSALS[case]
    table = make_table(conn, pg_schema, "typed", TYPED)
    upsert: dict[str, Any] = {"mode": "upsert", "key": ("id",)} if mode == "upsert" else {}
    coordinator = coordinator_for(postgres, table, job_id, tmp_path, one_phase=False, **upsert)
    good = typed_batch(id=pa.array([10, 11], pa.int64()))  # lands in the epoch first
    with pytest.raises(BadRowsError) as raised:
        coordinator.run_epoch(0, [good, typed_batch(**columns)])
    error = raised.value
    assert error.message.startswith("1 of 2 rows cannot be written: ")
    assert message in error.message
    assert fix in (error.fix or "")
    assert "on_bad_rows='dead_letter'" in (error.fix or "")
    assert len(error.refused) == 1
    assert (error.job, error.sink, error.epoch) == (job_id, "postgres", 0)
    assert coordinator.sinks[0].metrics()["bytes"] > 0  # the good batch was sent, then undone
    assert_nothing_landed(conn, coordinator, table, job_id, [])
    # The job goes on: the next epoch with good data lands.
    assert coordinator.run_epoch(0, [good]).outcome is EpochOutcome.COMMITTED
    assert [r[0] for r in rows(conn, table)] == [10, 11]


# -- constraints -------------------------------------------------------------------------------
@PHASES
def test_a_key_already_in_the_table_in_append_mode_names_the_key_and_upsert(
    one_phase: bool,
    postgres: PostgresEndpoint,
    conn: Conn,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
) -> None:
    table = make_table(conn, pg_schema, "events", "id bigint PRIMARY KEY, name text")
    conn.execute(
        sql.SQL("INSERT INTO {} VALUES (7, 'old')").format(sql.Identifier(pg_schema, "events"))
    )
    coordinator = coordinator_for(postgres, table, job_id, tmp_path, one_phase=one_phase)
    batch = pa.record_batch({"id": pa.array([5, 7], pa.int64()), "name": ["five", "seven"]})
    with pytest.raises(SchemaMismatchError) as raised:
        coordinator.run_epoch(0, [batch])
    error = raised.value
    assert "constraint 'events_pkey'" in error.message
    assert "key (id)=(7)" in error.message
    assert "the table already holds a row with this key" in (error.fix or "")
    assert "mode='upsert' with key=('id',)" in (error.fix or "")
    assert (error.job, error.epoch) == (job_id, 0)
    assert_nothing_landed(conn, coordinator, table, job_id, [(7, "old")])


@PHASES
@pytest.mark.parametrize("deferred", [False, True], ids=["immediate", "deferred"])
def test_constraints_the_rows_break_are_named(
    one_phase: bool,
    deferred: bool,
    postgres: PostgresEndpoint,
    conn: Conn,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
) -> None:
    """A foreign key (checked at the COPY, or at PREPARE / COMMIT when deferred) and a check
    constraint: each named, nothing committed."""
    make_table(conn, pg_schema, "parents", "id bigint PRIMARY KEY")
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(sql.Identifier(pg_schema, "parents")))
    when = " DEFERRABLE INITIALLY DEFERRED" if deferred else ""
    table = make_table(
        conn,
        pg_schema,
        "children",
        f"id bigint PRIMARY KEY, parent bigint CONSTRAINT child_parent REFERENCES "
        f'"{pg_schema}".parents (id){when}, score int CONSTRAINT score_positive CHECK (score > 0)',
    )
    coordinator = coordinator_for(postgres, table, job_id, tmp_path, one_phase=one_phase)
    orphan = pa.record_batch(
        {
            "id": pa.array([1, 2], pa.int64()),
            "parent": pa.array([1, 9], pa.int64()),
            "score": pa.array([1, 1], pa.int32()),
        }
    )
    with pytest.raises(SchemaMismatchError) as raised:
        coordinator.run_epoch(0, [orphan])
    assert "constraint 'child_parent'" in raised.value.message
    assert "key (parent)=(9) is not in the referenced table" in raised.value.message
    assert "write the referenced rows first" in (raised.value.fix or "")
    assert raised.value.epoch == 0
    assert_nothing_landed(conn, coordinator, table, job_id, [])

    negative = pa.record_batch(
        {
            "id": pa.array([3], pa.int64()),
            "parent": pa.array([1], pa.int64()),
            "score": pa.array([-1], pa.int32()),
        }
    )
    with pytest.raises(SchemaMismatchError) as raised:
        coordinator.run_epoch(0, [negative])
    assert "constraint 'score_positive'" in raised.value.message
    assert "break the constraint" in (raised.value.fix or "")
    assert_nothing_landed(conn, coordinator, table, job_id, [])


# -- duplicate keys in one upsert epoch --------------------------------------------------------
@PHASES
def test_duplicate_keys_of_an_upsert_epoch_are_named_with_the_dedup(
    one_phase: bool,
    postgres: PostgresEndpoint,
    conn: Conn,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
) -> None:
    table = make_table(conn, pg_schema, "users", "id bigint PRIMARY KEY, name text")
    coordinator = coordinator_for(
        postgres, table, job_id, tmp_path, one_phase=one_phase, mode="upsert", key=("id",)
    )
    ids = [1, 7, 7, 8, 8, 8, 9]
    batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "name": [str(i) for i in ids]})
    with pytest.raises(SchemaMismatchError) as raised:
        coordinator.run_epoch(0, [batch])
    error = raised.value
    assert "the epoch holds 2 upsert key(s) more than once" in error.message
    assert "id=8 (3 rows); id=7 (2 rows)" in error.message
    assert "id=1 " not in error.message
    assert "id=9" not in error.message
    assert 'dropDuplicates(["id"])' in (error.fix or "")
    assert "row_number() over (partition by id" in (error.fix or "")
    assert (error.job, error.epoch) == (job_id, 0)
    assert_nothing_landed(conn, coordinator, table, job_id, [])


def test_many_duplicate_keys_name_five_and_composite_keys_name_every_column(
    postgres: PostgresEndpoint, conn: Conn, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    table = make_table(conn, pg_schema, "pairs", "a bigint, b text, v int, PRIMARY KEY (a, b)")
    coordinator = coordinator_for(
        postgres, table, job_id, tmp_path, one_phase=False, mode="upsert", key=("a", "b")
    )
    a = [i for i in range(7) for _ in range(2)]
    batch = pa.record_batch(
        {"a": pa.array(a, pa.int64()), "b": ["x"] * 14, "v": pa.array([1] * 14, pa.int32())}
    )
    with pytest.raises(SchemaMismatchError) as raised:
        coordinator.run_epoch(0, [batch])
    message = raised.value.message
    assert "the epoch holds 7 upsert key(s) more than once" in message
    assert message.count("(2 rows)") == 5
    assert "a=0, b='x' (2 rows)" in message
    assert message.endswith("; ...")
    assert 'dropDuplicates(["a", "b"])' in (raised.value.fix or "")
    assert_nothing_landed(conn, coordinator, table, job_id, [])


# -- missing schemas: refused at start, nothing created ----------------------------------------
@pytest.mark.parametrize("create_table", [False, True])
def test_a_table_in_a_missing_schema_is_refused_at_start_creating_nothing(
    create_table: bool,
    postgres: PostgresEndpoint,
    conn: Conn,
    pg_schema: str,
    unique: UniqueNames,
    tmp_path: Path,
) -> None:
    missing = unique.name("nosuch")
    # The marker and fence tables would go to an existing schema: they must not be made.
    sink = PostgresSink(
        Postgres(
            postgres.conninfo(),
            f"{missing}.events",
            create_table=create_table,
            meta_schema=pg_schema,
        )
    )
    coordinator = Coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path / "store"))
    with pytest.raises(ConfigError) as raised:
        coordinator.start()
    error = raised.value
    assert f"schema '{missing}' does not exist (named by table='{missing}.events')" in error.message
    assert f"CREATE SCHEMA {missing};" in (error.fix or "")
    assert (error.job, error.sink) == (unique.job_id, "postgres")
    assert not schema_exists(conn, missing)
    assert tables_in(conn, pg_schema) == []
    assert prepared_gids(conn, unique.job_id, "postgres") == []


def test_a_missing_meta_schema_is_refused_at_start_creating_nothing(
    postgres: PostgresEndpoint, conn: Conn, pg_schema: str, unique: UniqueNames, tmp_path: Path
) -> None:
    table = make_table(conn, pg_schema, "events", "id bigint")
    missing = unique.name("nometa")
    sink = PostgresSink(Postgres(postgres.conninfo(), table, meta_schema=missing))
    coordinator = Coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path / "store"))
    with pytest.raises(ConfigError) as raised:
        coordinator.start()
    assert f"schema '{missing}' does not exist (named by meta_schema='{missing}')" in (
        raised.value.message
    )
    assert f"CREATE SCHEMA {missing};" in (raised.value.fix or "")
    assert not schema_exists(conn, missing)
    assert tables_in(conn, pg_schema) == ["events"]


@pytest.mark.parametrize("where", ["table", "meta_schema"])
def test_the_default_decision_store_in_a_missing_schema_says_whose_it_is(
    where: str, postgres: PostgresEndpoint, conn: Conn, pg_schema: str, unique: UniqueNames
) -> None:
    """A job naming no decision store keeps it in the first Postgres sink's (meta) schema: a
    missing one is refused before any table is created, naming the sink."""
    missing = unique.name("nosuch")
    config: dict[str, Any] = {"dsn": postgres.conninfo(), "name": "pg", "create_table": True}
    if where == "table":
        config["table"] = f"{missing}.events"
    else:
        config.update(table=make_table(conn, pg_schema, "events", "id bigint"), meta_schema=missing)
    store = default_store_for("postgres", config)
    assert store is not None
    sink = PostgresSink(Postgres(**config))
    coordinator = Coordinator(unique.job_id, [sink], store)
    with pytest.raises(ConfigError) as raised:
        coordinator.start()
    assert (
        f"schema '{missing}' of the job's decision store, in the database of postgres sink "
        "'pg' does not exist"
    ) in raised.value.message
    assert f"CREATE SCHEMA {missing}" in (raised.value.fix or "")
    assert not schema_exists(conn, missing)
    assert tables_in(conn, pg_schema) == ([] if where == "table" else ["events"])


# -- connection failures -----------------------------------------------------------------------
@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port that accepts TCP connections and never answers (a server hung, or a firewall
    that swallows packets after the handshake)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    server.close()


def unreachable(postgres: PostgresEndpoint, how: str, black_hole: int) -> str:
    if how == "refused":
        return PostgresEndpoint("127.0.0.1", 1, postgres.user, postgres.password).conninfo()
    return PostgresEndpoint("127.0.0.1", black_hole, postgres.user, postgres.password).conninfo()


@pytest.mark.parametrize("how", ["refused", "timeout"])
def test_an_unreachable_server_is_an_unreachable_error_naming_whose_connection(
    how: str, postgres: PostgresEndpoint, unique: UniqueNames, black_hole: int
) -> None:
    dsn = unreachable(postgres, how, black_hole)
    config: dict[str, Any] = {"dsn": dsn, "table": "events", "name": "pg", "connect_timeout_s": 1}
    # The sink itself.
    sink = PostgresSink(Postgres(**config))
    with pytest.raises(UnreachableError) as raised:
        sink.open(OpenContext(unique.job_id, "pg", 1))
    port = 1 if how == "refused" else black_hole
    assert raised.value.message.startswith("cannot connect to Postgres at ")
    assert "host=127.0.0.1" in raised.value.message
    assert f"port={port} " in raised.value.message
    assert ("timeout expired" if how == "timeout" else "Connection refused") in raised.value.message
    assert raised.value.sink == "pg"
    # A job naming no decision store: its default store, in the sink's database, connects
    # first; the error says so.
    store = default_store_for("postgres", config)
    assert store is not None
    coordinator = Coordinator(unique.job_id, [PostgresSink(Postgres(**config))], store)
    with pytest.raises(TransientError) as transient:
        coordinator.start()
    error = transient.value
    assert isinstance(error, UnreachableError)
    assert error.retriable
    assert error.message.startswith("cannot connect to Postgres at ")
    assert f"port={port}" in error.message
    assert "(the job's decision store, in the database of postgres sink 'pg'): " in error.message
    assert "check that the server runs" in (error.fix or "")
    assert postgres.password not in str(error)
    assert "decision store at" not in str(error)


@pytest.mark.parametrize(
    ("wrong", "says", "fix"),
    [
        (
            {"password": "wrong-password"},
            "password authentication failed",
            "check the user and password",
        ),
        (
            {"dbname": "ds_no_such_database"},
            'database "ds_no_such_database" does not exist',
            "create the database",
        ),
    ],
)
def test_a_dsn_the_server_refuses_is_a_config_error_without_the_password(
    wrong: dict[str, str],
    says: str,
    fix: str,
    postgres: PostgresEndpoint,
    unique: UniqueNames,
) -> None:
    dsn = postgres.conninfo(**wrong)
    sink = PostgresSink(Postgres(dsn, "events"))
    with pytest.raises(ConfigError) as raised:
        sink.open(OpenContext(unique.job_id, "postgres", 1))
    assert says in raised.value.message
    assert "retrying cannot help" in (raised.value.fix or "")
    assert fix in (raised.value.fix or "")
    assert "wrong-password" not in str(raised.value)
    assert postgres.password not in str(raised.value)
    store = PostgresDecisionStore(dsn)
    with pytest.raises(ConfigError) as raised:
        store.open(unique.job_id)
    assert says in raised.value.message
    assert "(the job's decision store)" in raised.value.message
    assert "wrong-password" not in str(raised.value)
