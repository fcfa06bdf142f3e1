"""The Postgres sink against the test bed's real Postgres: append and upsert, bad input (each
refused with an error naming the problem, the table unchanged, no prepared transaction left),
fencing, a participant prepared in one process and finished in another, and secrets."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from datetime import date, datetime, timezone
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core import CommitHandle, CommitOutcome, OpenContext
from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    FencedError,
    SchemaMismatchError,
    TransientError,
)
from durable_sinks.core.redaction import redact
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.sinks import create
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from durable_sinks.sinks.postgres.handles import PostgresHandleDetails
from tests.conftest import UniqueNames
from tests.services import PostgresEndpoint
from tests.services._layout import REPO_ROOT
from tests.support.targets import prepared_gids

UTC = timezone.utc

ROWS_BEFORE = [(1, "one", 1.0), (2, "two", 2.0)]


@pytest.fixture
def table(conn: psycopg.Connection[Any], pg_schema: str) -> str:
    """`schema.events (id bigint primary key, name text not null, score double precision)`
    holding two rows."""
    name = f"{pg_schema}.events"
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, name text NOT NULL, score double precision)"
        ).format(sql.Identifier(pg_schema, "events"))
    )
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(
                sql.Identifier(pg_schema, "events")
            ),
            ROWS_BEFORE,
        )
    return name


def rows(conn: psycopg.Connection[Any], table: str) -> list[tuple[Any, ...]]:
    schema, name = table.split(".")
    query = sql.SQL("SELECT * FROM {} ORDER BY 1").format(sql.Identifier(schema, name))
    return [tuple(r) for r in conn.execute(query).fetchall()]


def events(ids: list[int], names: list[str | None] | None = None) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array(names or [f"name {i}" for i in ids], pa.string()),
            "score": pa.array([i / 2 for i in ids], pa.float64()),
        }
    )


def job(
    postgres: PostgresEndpoint, table: str, unique: UniqueNames, tmp_path: Any, **options: Any
) -> Coordinator:
    sink = PostgresSink(Postgres(postgres.conninfo(), table, **options))
    coordinator = Coordinator(
        unique.job_id, [sink], LocalDirectoryStore(tmp_path / "store"), source="query-1"
    )
    coordinator.start()
    return coordinator


def test_append_epochs_and_replays(
    postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames, tmp_path: Any
) -> None:
    coordinator = job(postgres, table, unique, tmp_path)
    assert coordinator.run_epoch(0, [events([10, 11]), events([12])]).outcome is (
        EpochOutcome.COMMITTED
    )
    assert coordinator.run_epoch(0, [events([99])]).outcome is EpochOutcome.ALREADY_COMMITTED
    coordinator.run_epoch(1, [])  # an empty epoch still records its marker
    assert [r[0] for r in rows(conn, table)] == [1, 2, 10, 11, 12]
    assert coordinator.sinks[0].last_committed_epoch() == 1
    assert prepared_gids(conn, unique.job_id, "postgres") == []


def test_upsert_merges_by_key_and_leaves_no_staging_table(
    postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames, tmp_path: Any
) -> None:
    coordinator = job(postgres, table, unique, tmp_path, mode="upsert", key=("id",))
    coordinator.run_epoch(0, [events([2, 3], ["two again", "three"])])
    coordinator.run_epoch(1, [events([3], ["three again"])])
    assert rows(conn, table) == [(1, "one", 1.0), (2, "two again", 1.0), (3, "three again", 1.5)]
    schema = table.split(".")[0]
    staging = conn.execute(
        "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename LIKE 'ds_stage_%%'",
        (schema,),
    ).fetchone()
    assert staging == (0,)


def test_create_table_from_the_arrow_schema(
    postgres: PostgresEndpoint, conn: Any, pg_schema: str, unique: UniqueNames, tmp_path: Any
) -> None:
    batch = pa.record_batch(
        {
            "id": pa.array([1], pa.int64()),
            "small": pa.array([1], pa.int32()),
            "name": pa.array(["ü"], pa.string()),
            "score": pa.array([0.5], pa.float64()),
            "flag": pa.array([True], pa.bool_()),
            "at": pa.array([datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)], pa.timestamp("us", "UTC")),
            "day": pa.array([date(2026, 1, 2)], pa.date32()),
            "blob": pa.array([b"\x00\x01"], pa.binary()),
        },
        schema=pa.schema([pa.field("id", pa.int64(), nullable=False)])
        .append(pa.field("small", pa.int32()))
        .append(pa.field("name", pa.string()))
        .append(pa.field("score", pa.float64()))
        .append(pa.field("flag", pa.bool_()))
        .append(pa.field("at", pa.timestamp("us", "UTC")))
        .append(pa.field("day", pa.date32()))
        .append(pa.field("blob", pa.binary())),
    )
    coordinator = job(postgres, f"{pg_schema}.created", unique, tmp_path, create_table=True)
    coordinator.run_epoch(0, [batch])
    types = dict(
        conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'created'",
            (pg_schema,),
        ).fetchall()
    )
    assert types == {
        "id": "bigint",
        "small": "integer",
        "name": "text",
        "score": "double precision",
        "flag": "boolean",
        "at": "timestamp with time zone",
        "day": "date",
        "blob": "bytea",
    }
    assert rows(conn, f"{pg_schema}.created") == [
        (
            1,
            1,
            "ü",
            0.5,
            True,
            datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
            date(2026, 1, 2),
            b"\x00\x01",
        )
    ]


BAD_BATCHES = {
    "wrong type": (
        pa.record_batch({"id": pa.array([5], pa.int32()), "name": ["x"], "score": [1.0]}),
        "column 'id' is bigint in the table but the batch has Arrow int32",
    ),
    "column not in the table": (
        pa.record_batch({"id": pa.array([5], pa.int64()), "name": ["x"], "colour": ["red"]}),
        "column 'colour' is not in the table",
    ),
    "NOT NULL column missing": (
        pa.record_batch({"id": pa.array([5], pa.int64()), "score": [1.0]}),
        "column 'name' is NOT NULL without a default but the batch does not have it",
    ),
    "null into NOT NULL": (
        events([5, 6], ["five", None]),
        "1 of 2 rows cannot be written: not_null (column 'name'): 1 row (first: row 1: null "
        'value in column "name" violates not-null constraint)',
    ),
    "NUL character in text": (
        events([5], ["a\x00b"]),
        "1 of 1 rows cannot be written: nul_character (column 'name'): 1 row (first: row 0: "
        'text in column "name" holds the NUL character (U+0000)',
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_bad_batches_are_refused_and_leave_nothing(
    case: str,
    postgres: PostgresEndpoint,
    table: str,
    conn: Any,
    unique: UniqueNames,
    tmp_path: Any,
) -> None:
    bad, message = BAD_BATCHES[case]
    coordinator = job(postgres, table, unique, tmp_path)
    with pytest.raises(SchemaMismatchError) as raised:
        coordinator.run_epoch(0, [events([3, 4]), bad])  # a good batch first: it must vanish
    assert message in str(raised.value)
    assert raised.value.sink == "postgres"
    assert rows(conn, table) == ROWS_BEFORE
    assert prepared_gids(conn, unique.job_id, "postgres") == []
    assert coordinator.store.get(0) is None


def test_duplicate_keys_in_one_upsert_epoch_are_refused(
    postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames, tmp_path: Any
) -> None:
    coordinator = job(postgres, table, unique, tmp_path, mode="upsert", key=("id",))
    with pytest.raises(SchemaMismatchError, match="cannot affect row a second time"):
        coordinator.run_epoch(0, [events([7, 7])])
    assert rows(conn, table) == ROWS_BEFORE
    assert prepared_gids(conn, unique.job_id, "postgres") == []


@pytest.mark.parametrize(
    ("options", "message", "fix"),
    [
        ({"table": "public.ds_no_such_table"}, "does not exist", "create_table=True"),
        ({"table": "nowhere.missing"}, "schema 'nowhere' does not exist", "CREATE SCHEMA"),
        ({"mode": "upsert", "key": ("name",)}, "needs a unique index", "CREATE UNIQUE INDEX"),
        ({"participants_in_flight": 100_000}, "max_prepared_transactions is", "restart Postgres"),
    ],
)
def test_bad_setups_are_refused_at_start(
    options: dict[str, Any],
    message: str,
    fix: str,
    postgres: PostgresEndpoint,
    table: str,
    unique: UniqueNames,
    tmp_path: Any,
) -> None:
    config = {"table": table, **options}
    sink = PostgresSink(Postgres(postgres.conninfo(), **config))
    # Two-phase, as in any multi-sink job (a one-phase sink needs no prepared transactions).
    coordinator = Coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path), one_phase=False)
    with pytest.raises(ConfigError, match=message) as raised:
        coordinator.start()
    assert fix in (raised.value.fix or "")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dsn": ""}, "`dsn` is empty"),
        ({"dsn": "host=x port"}, "not a valid connection string"),
        ({"table": "a.b.c"}, "is not `table` or `schema.table`"),
        ({"mode": "upsert"}, "upsert mode needs `key`"),
        ({"key": ("id",)}, "only used in upsert mode"),
    ],
)
def test_bad_config_is_refused_when_built(options: dict[str, Any], message: str) -> None:
    config = {"dsn": "host=localhost", "table": "t", **options}
    with pytest.raises(ConfigError, match=message):
        Postgres(**config)


def test_registry_builds_postgres_sinks(postgres: PostgresEndpoint, table: str) -> None:
    sink = create(
        "postgres", {"dsn": postgres.conninfo(), "table": table, "mode": "upsert", "key": "id"}
    )
    assert isinstance(sink, PostgresSink)
    assert sink.config.key == ("id",)


def test_unreachable_server_is_a_transient_error_without_the_password(
    postgres: PostgresEndpoint,
    unique: UniqueNames,
) -> None:
    dead = PostgresEndpoint("127.0.0.1", 1, postgres.user, postgres.password)
    sink = PostgresSink(Postgres(dead.conninfo(connect_timeout="2"), "t"))
    with pytest.raises(TransientError, match="cannot connect to Postgres at") as raised:
        sink.open(OpenContext(unique.job_id, "postgres", 1))
    assert postgres.password not in str(raised.value)
    assert "port=1" in str(raised.value)


def test_an_older_generation_is_fenced_and_commits_nothing(
    postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames
) -> None:
    config = Postgres(postgres.conninfo(), table)
    old, new = PostgresSink(config), PostgresSink(config)
    old.open(OpenContext(unique.job_id, "postgres", 1))
    old.begin_epoch(0)
    old.write_batch(events([20]))
    new.open(OpenContext(unique.job_id, "postgres", 2))  # ends the old session
    with pytest.raises(FencedError):
        old.write_batch(events([21]))
    with pytest.raises(FencedError):
        old.begin_epoch(1)
    with pytest.raises(FencedError, match="older than"):
        PostgresSink(config).open(OpenContext(unique.job_id, "postgres", 1))
    assert rows(conn, table) == ROWS_BEFORE
    assert prepared_gids(conn, unique.job_id, "postgres") == []


CHILD = textwrap.dedent("""
    import json, sys
    import pyarrow as pa
    from durable_sinks.core import OpenContext
    from durable_sinks.sinks.postgres import PostgresSink, Postgres
    dsn, table, job = sys.argv[1:4]
    sink = PostgresSink(Postgres(dsn, table))
    sink.open(OpenContext(job, "postgres", 1))
    sink.begin_epoch(0)
    sink.write_batch(pa.record_batch({"id": pa.array([30, 31], pa.int64()),
                                      "name": ["a", "b"], "score": [1.0, 2.0]}))
    print(sink.pre_commit(0).dumps())
""")


@pytest.mark.parametrize("finish", ["commit", "rollback"])
def test_prepared_in_one_process_finished_in_another(
    finish: str, postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, postgres.conninfo(), table, unique.job_id],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    handle = CommitHandle.from_json(json.loads(done.stdout))
    assert prepared_gids(conn, unique.job_id, "postgres") == [handle.participant]
    assert rows(conn, table) == ROWS_BEFORE  # prepared: invisible

    sink = PostgresSink(Postgres(postgres.conninfo(), table))
    sink.open(OpenContext(unique.job_id, "postgres", 2))
    assert sink.recover_prepared() == [
        CommitHandle(
            "postgres", 0, handle.participant, 0, 0, "", PostgresHandleDetails("0").to_json()
        )
    ]
    if finish == "commit":
        assert sink.commit_epoch(0, handle) is CommitOutcome.COMMITTED
        assert sink.commit_epoch(0, handle) is CommitOutcome.ALREADY_COMMITTED
        assert [r[0] for r in rows(conn, table)] == [1, 2, 30, 31]
        assert sink.last_committed_epoch() == 0
    else:
        sink.rollback_epoch(0, handle)
        sink.rollback_epoch(0, handle)
        assert rows(conn, table) == ROWS_BEFORE
    assert prepared_gids(conn, unique.job_id, "postgres") == []


def test_secrets_never_leave_the_dsn(
    postgres: PostgresEndpoint,
    table: str,
    conn: Any,
    unique: UniqueNames,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = postgres.password
    config = Postgres(postgres.conninfo(), table)
    store = PostgresDecisionStore(postgres.conninfo(), schema=table.split(".")[0])
    coordinator = Coordinator(unique.job_id, [PostgresSink(config)], store)
    coordinator.start()
    result = coordinator.run_epoch(0, [events([40])])
    errors: list[str] = []
    for bad in (events([41], [None]), pa.record_batch({"id": pa.array([1], pa.int32())})):
        try:
            coordinator.run_epoch(1, [bad])
        except DurableSinkError as exc:
            errors.append(str(exc) + repr(exc) + str(exc.fix))
    assert len(errors) == 2
    places = {
        "logs": "\n".join(r.getMessage() for r in caplog.records),
        "errors": "\n".join(errors),
        "reprs": repr(config) + repr(coordinator.sinks[0]) + repr(store),
        "decision": result.decision.to_bytes().decode(),
        "markers": str(rows(conn, f"{table.split('.')[0]}.durable_sinks_epochs")),
        "redacted": redact(postgres.conninfo()),
    }
    leaks = [place for place, text in places.items() if secret in text]
    assert leaks == []
    assert "password" not in places["redacted"]


def test_missing_privileges_are_named_with_the_grant(
    postgres: PostgresEndpoint, table: str, conn: Any, unique: UniqueNames, tmp_path: Any
) -> None:
    schema = table.split(".")[0]
    role, password = unique.name("role"), "limited-password-1"
    owner = PostgresSink(Postgres(postgres.conninfo(), table))
    owner.open(OpenContext(unique.name("owner"), "postgres", 1))  # creates the meta tables
    owner.close()
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)
        )
    )
    try:
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(schema), sql.Identifier(role)
            )
        )
        conn.execute(
            sql.SQL(
                "GRANT SELECT, INSERT, UPDATE ON {}.durable_sinks_epochs, {}.durable_sinks_fences "
                "TO {}"
            ).format(sql.Identifier(schema), sql.Identifier(schema), sql.Identifier(role))
        )
        conn.execute(
            sql.SQL("GRANT SELECT ON {} TO {}").format(
                sql.Identifier(*table.split(".")), sql.Identifier(role)
            )
        )
        limited = PostgresEndpoint(postgres.host, postgres.port, role, password)
        sink = PostgresSink(Postgres(limited.conninfo(), table))
        coordinator = Coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path))
        with pytest.raises(ConfigError, match="lacks INSERT") as raised:
            coordinator.start()
        assert f"GRANT INSERT ON {table}" in (raised.value.fix or "")
        sink.close()
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
