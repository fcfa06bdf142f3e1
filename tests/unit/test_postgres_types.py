"""The Postgres sink's pure logic for bad input, without a server: column types compared
without their typmods, the typmods that would silently change values, the Spark cast each
refusal names, and what a failed connection means (ConfigError or UnreachableError)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from durable_sinks import ConfigError, TransientError, UnreachableError
from durable_sinks.clients.postgres import connection_failure
from durable_sinks.sinks.postgres.columns import (
    TableColumn,
    base_type,
    mismatches,
    numeric_typmod,
    spark_type,
)


@pytest.mark.parametrize(
    ("formatted", "base"),
    [
        ("numeric(10,2)", "numeric"),
        ("numeric", "numeric"),
        ("character varying(10)", "character varying"),
        ("character(5)", "character"),
        ("timestamp(3) with time zone", "timestamp with time zone"),
        ("timestamp(0) without time zone", "timestamp without time zone"),
        ("time(3) without time zone", "time without time zone"),
        ("interval(3)", "interval"),
        ("interval day to second(3)", "interval"),
        ("interval year to month", "interval"),
        ("double precision", "double precision"),
        ('"char"', '"char"'),
    ],
)
def test_base_type_strips_typmods_anywhere(formatted: str, base: str) -> None:
    assert base_type(formatted) == base


def test_numeric_typmod_and_spark_cast() -> None:
    assert numeric_typmod("numeric(10,2)") == (10, 2)
    assert numeric_typmod("numeric(5)") == (5, 0)
    assert numeric_typmod("numeric") is None
    assert numeric_typmod("character varying(10)") is None
    assert spark_type("numeric(10,2)") == "decimal(10,2)"
    assert spark_type("integer") == "int"
    assert spark_type("character varying(10)") == "string"
    assert spark_type("timestamp(3) with time zone") == "timestamp"
    assert spark_type("jsonb") is None


def column(name: str, type_: str, *, not_null: bool = False) -> TableColumn:
    return TableColumn(name, type_, not_null, has_default=False)


def test_typed_columns_fit_their_spark_types() -> None:
    schema = pa.schema(
        [
            ("amount", pa.decimal128(10, 2)),
            ("narrow", pa.decimal128(4, 1)),
            ("wide", pa.decimal128(20, 2)),  # may overflow: the server refuses such values
            ("name", pa.string()),
            ("code", pa.large_string()),
            ("at", pa.timestamp("us", "UTC")),
            ("took", pa.duration("us")),
        ]
    )
    table = {
        c.name: c
        for c in [
            column("amount", "numeric(10,2)"),
            column("narrow", "numeric(10,2)"),
            column("wide", "numeric(10,2)"),
            column("name", "character varying(10)"),
            column("code", "character(3)"),
            column("at", "timestamp(3) with time zone"),
            column("took", "interval minute to second(3)"),
        ]
    }
    assert mismatches(schema, table) == []


def test_a_larger_scale_is_refused_with_the_cast_and_the_alter() -> None:
    [problem] = mismatches(
        pa.schema([("amount", pa.decimal128(12, 4))]),
        {"amount": column("amount", "numeric(10,2)")},
    )
    assert problem.problem == (
        "column 'amount' is numeric(10,2) in the table but the batch has Arrow "
        "decimal128(12, 4) (Spark decimal(12,4)): Postgres would round its values to 2 "
        "decimal places"
    )
    assert problem.fix == (
        'round it in Spark: col("amount").cast("decimal(10,2)"), or alter the column to '
        "numeric(12,4)"
    )


@pytest.mark.parametrize(("fields", "unit"), [("day", "day"), ("day to minute", "minute")])
def test_interval_fields_coarser_than_seconds_are_refused(fields: str, unit: str) -> None:
    [problem] = mismatches(
        pa.schema([("took", pa.duration("us"))]), {"took": column("took", f"interval {fields}")}
    )
    assert problem.problem.endswith(f"Postgres would cut its values down to whole {unit}s")


def test_another_type_names_both_types_and_what_the_sink_writes() -> None:
    [problem] = mismatches(
        pa.schema([("id", pa.int32())]), {"id": column("id", "bigint", not_null=True)}
    )
    assert problem.problem == (
        "column 'id' is bigint in the table but the batch has Arrow int32, which the sink "
        "writes as integer"
    )
    assert problem.fix == 'cast it in Spark: col("id").cast("bigint"), or alter the column'


def test_an_unencodable_type_and_missing_columns_each_have_a_fix() -> None:
    found = mismatches(
        pa.schema(
            [("at", pa.timestamp("ns")), ("tags", pa.list_(pa.string())), ("extra", pa.int64())]
        ),
        {
            "at": column("at", "timestamp without time zone"),
            "tags": column("tags", "text"),
            "id": column("id", "bigint", not_null=True),
        },
    )
    assert [m.problem for m in found] == [
        "column 'at' has Arrow type timestamp[ns], which binary COPY cannot encode",
        "column 'tags' is text in the table but the batch has Arrow list<item: string>, which "
        "the sink writes as a Postgres array",
        "column 'extra' is not in the table",
        "column 'id' is NOT NULL without a default but the batch does not have it",
    ]
    assert found[0].fix == (
        'cast it in Spark: col("at").cast("timestamp_ntz"), or alter the column'
    )
    assert all(m.fix for m in found)


DSN = "host=db.example port=5432 user=app password=hunter2 dbname=orders"


@pytest.mark.parametrize(
    "message",
    [
        'connection failed: connection to server at "10.0.0.1", port 5432 failed: FATAL:  '
        'password authentication failed for user "app"',
        'connection failed: connection to server at "10.0.0.1", port 5432 failed: FATAL:  '
        'database "orders" does not exist',
        'connection failed: connection to server at "10.0.0.1", port 5432 failed: FATAL:  '
        'no pg_hba.conf entry for host "10.0.0.2", user "app", database "orders"',
    ],
)
def test_a_server_refusing_the_dsn_is_a_config_error(message: str) -> None:
    error = connection_failure(message, DSN, job="j", sink="pg")
    assert type(error) is ConfigError
    assert "retrying cannot help" in (error.fix or "")
    assert "hunter2" not in str(error)
    assert error.message.startswith("cannot connect to Postgres at ")


@pytest.mark.parametrize(
    "message",
    [
        'connection failed: connection to server at "10.0.0.1", port 5432 failed: Connection '
        "refused",
        'connection failed: connection to server at "10.0.0.1", port 5432 failed: timeout expired',
        "failed to resolve host 'db.example': [Errno -3] Temporary failure in name resolution",
        'connection failed: connection to server at "10.0.0.1", port 5432 failed: FATAL:  the '
        "database system is starting up",
    ],
)
def test_an_unreachable_server_is_a_retriable_unreachable_error(message: str) -> None:
    error = connection_failure(message, DSN, where="the job's decision store", job="j")
    assert isinstance(error, UnreachableError)
    assert isinstance(error, TransientError)
    assert error.retriable
    assert "(the job's decision store): " in error.message
    assert "hunter2" not in str(error)


def test_the_dsns_own_connect_timeout_is_used_unless_the_option_is_given() -> None:
    from durable_sinks import Postgres
    from durable_sinks.manifest.postgres import PostgresDecisionStore

    in_dsn = "host=db port=5432 connect_timeout=3"
    assert Postgres(in_dsn, "t").effective_connect_timeout_s == 3
    assert Postgres(in_dsn, "t", connect_timeout_s=7).effective_connect_timeout_s == 7
    assert Postgres(in_dsn, "t", connect_timeout_s=2.5).effective_connect_timeout_s == 3
    assert Postgres("host=db", "t").effective_connect_timeout_s == 10
    assert Postgres("postgresql://db/x?connect_timeout=4", "t").effective_connect_timeout_s == 4
    assert PostgresDecisionStore(in_dsn).connect_timeout_s == 3
    assert PostgresDecisionStore(in_dsn, connect_timeout_s=5).connect_timeout_s == 5
