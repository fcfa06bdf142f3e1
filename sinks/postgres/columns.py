"""Arrow -> Postgres type mapping for binary COPY (through pgpq), and the checks that turn a
batch that does not fit its table into a SchemaMismatchError naming the column."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pgpq
import pyarrow as pa
import pyarrow.compute as pc

# pgpq's encoder type -> the base types (typmods stripped, see `base_type`) of the Postgres
# columns whose binary input accepts its bytes.
_BINARY_COMPATIBLE = {
    "Bool": {"boolean"},
    "Bytea": {"bytea"},
    "Int2": {"smallint"},
    "Int4": {"integer"},
    "Int8": {"bigint"},
    "Float4": {"real"},
    "Float8": {"double precision"},
    "Numeric": {"numeric"},
    # character(n) pads with blanks, as it does for any insert (checked on the test bed).
    "Text": {"text", "character varying", "character", "bpchar", "name"},
    "Char": {'"char"'},
    "Jsonb": {"jsonb"},
    "Date": {"date"},
    "Time": {"time without time zone"},
    # Same wire format (microseconds since 2000-01-01); timestamptz reads it as UTC.
    "Timestamp": {"timestamp without time zone", "timestamp with time zone"},
    "Interval": {"interval"},
}
# What CREATE TABLE uses for each Arrow type when the sink creates the table.
_DDL = {
    "Bool": "boolean",
    "Bytea": "bytea",
    "Int2": "smallint",
    "Int4": "integer",
    "Int8": "bigint",
    "Float4": "real",
    "Float8": "double precision",
    "Numeric": "numeric",
    "Text": "text",
    "Jsonb": "jsonb",
    "Date": "date",
    "Time": "time without time zone",
    "Interval": "interval",
}
# How messages name what pgpq writes for the encoder types CREATE TABLE has no column for.
_NO_DDL = {"List": "a Postgres array", "UserDefined": "a composite (row) value", "Char": '"char"'}
# The Spark type whose column arrives as the Arrow type a Postgres base type accepts (for the
# `cast` a message suggests); numeric's is built from the column's precision and scale.
_SPARK = {
    "boolean": "boolean",
    "bytea": "binary",
    "smallint": "smallint",
    "integer": "int",
    "bigint": "bigint",
    "real": "float",
    "double precision": "double",
    "text": "string",
    "character varying": "string",
    "character": "string",
    "bpchar": "string",
    "name": "string",
    "date": "date",
    "timestamp without time zone": "timestamp_ntz",
    "timestamp with time zone": "timestamp",
    "interval": "interval day to second",
}
#: A typmod in format_type()'s output: "(10)", "(10,2)", "(3)".
_TYPMOD = re.compile(r"\((\d+)(?:\s*,\s*(\d+))?\)")
#: Interval field restrictions in format_type()'s output ("interval day to second(3)").
_INTERVAL_FIELDS = re.compile(r"^interval\s+([a-z ]+?)\s*(?:\(\d+\))?$")


@dataclass(frozen=True)
class TableColumn:
    name: str
    type: str  # format_type(), e.g. "bigint", "timestamp(3) with time zone", "numeric(10,2)"
    not_null: bool
    has_default: bool

    @property
    def base_type(self) -> str:
        return base_type(self.type)


@dataclass(frozen=True)
class Mismatch:
    """One way a batch column does not fit its table column, and how to fix that one."""

    problem: str
    fix: str


def base_type(formatted: str) -> str:
    """A format_type() name without its typmods: "numeric(10,2)" -> "numeric",
    "timestamp(3) with time zone" -> "timestamp with time zone", "character varying(10)" ->
    "character varying", "interval day to second(3)" -> "interval"."""
    bare = " ".join(_TYPMOD.sub("", formatted).split())
    return "interval" if _INTERVAL_FIELDS.match(bare) else bare


def numeric_typmod(formatted: str) -> tuple[int, int] | None:
    """(precision, scale) of a numeric(p,s) / numeric(p) column; None for plain numeric."""
    found = _TYPMOD.search(formatted)
    if not formatted.startswith("numeric") or found is None:
        return None
    return int(found.group(1)), int(found.group(2) or 0)


def spark_type(column_type: str) -> str | None:
    """The Spark SQL type to cast a column to so that it fits `column_type`, when there is
    one (e.g. "decimal(10,2)" for numeric(10,2), "int" for integer)."""
    base = base_type(column_type)
    if base == "numeric":
        typmod = numeric_typmod(column_type)
        return f"decimal({typmod[0]},{typmod[1]})" if typmod else "decimal(38,18)"
    return _SPARK.get(base)


def encoder_type(field: pa.Field) -> str:
    """pgpq's name for the Postgres type it encodes `field` as (e.g. "Int8"), or raise
    TypeError for Arrow types it cannot encode."""
    schema = pgpq.ArrowToPostgresBinaryEncoder(pa.schema([field])).schema()
    return type(schema.columns[0].data_type).__name__


def ddl_type(field: pa.Field) -> str:
    """The column type CREATE TABLE uses for `field` (see docs/postgres.md)."""
    kind = encoder_type(field)
    if kind == "Timestamp":
        return "timestamp with time zone" if field.type.tz else "timestamp without time zone"
    if kind not in _DDL:
        raise TypeError(f"no column type for Arrow {field.type}")
    return _DDL[kind]


def _cast(name: str, column_type: str) -> str:
    """How to make the batch's column fit: a Spark cast where one exists, else alter."""
    target = spark_type(column_type)
    if target is None:
        return f"alter column {name!r} to a type the batch's column is written as"
    return f'cast it in Spark: col("{name}").cast("{target}"), or alter the column'


def _typmod_change(field: pa.Field, column: TableColumn) -> Mismatch | None:
    """A column whose type fits but whose typmod would silently change the batch's values
    as Postgres applies it; None when the values arrive as sent (or are refused by the
    server, e.g. a string longer than varchar(n), a number too large for numeric(p,s))."""
    name = column.name
    typmod = numeric_typmod(column.type)
    if typmod is not None and pa.types.is_decimal(field.type):
        precision, scale = typmod
        if field.type.scale > scale:
            return Mismatch(
                f"column {name!r} is {column.type} in the table but the batch has Arrow "
                f"{field.type} (Spark decimal({field.type.precision},{field.type.scale})): "
                f"Postgres would round its values to {scale} decimal places",
                f'round it in Spark: col("{name}").cast("decimal({precision},{scale})"), or '
                f"alter the column to numeric({precision - scale + field.type.scale},"
                f"{field.type.scale})",
            )
    fields = _INTERVAL_FIELDS.match(" ".join(_TYPMOD.sub("", column.type).split()))
    if fields is not None and not fields.group(1).endswith("second"):
        unit = fields.group(1).split()[-1]
        return Mismatch(
            f"column {name!r} is {column.type} in the table but the batch has Arrow "
            f"{field.type} (durations, sent as microseconds): Postgres would cut its values "
            f"down to whole {unit}s",
            f"alter column {name!r} to interval (or interval ... to second)",
        )
    return None


def mismatches(schema: pa.Schema, table: dict[str, TableColumn]) -> list[Mismatch]:
    """Every way the batch schema does not fit the table, one sentence and fix each."""
    problems = []
    for field in schema:
        column = table.get(field.name)
        if column is None:
            problems.append(
                Mismatch(
                    f"column {field.name!r} is not in the table",
                    f"drop or rename column {field.name!r} in the query, or add it to the table",
                )
            )
            continue
        try:
            kind = encoder_type(field)
        except Exception:  # noqa: BLE001 - pgpq raises plain exceptions for unsupported types
            problems.append(
                Mismatch(
                    f"column {field.name!r} has Arrow type {field.type}, which binary "
                    "COPY cannot encode",
                    _cast(field.name, column.type),
                )
            )
            continue
        if column.base_type not in _BINARY_COMPATIBLE.get(kind, set()):
            written = (
                ddl_type(field) if kind in _DDL or kind == "Timestamp" else _NO_DDL.get(kind, kind)
            )
            problems.append(
                Mismatch(
                    f"column {field.name!r} is {column.type} in the table but the batch has "
                    f"Arrow {field.type}, which the sink writes as {written}",
                    _cast(field.name, column.type),
                )
            )
            continue
        changed = _typmod_change(field, column)
        if changed is not None:
            problems.append(changed)
    for column in table.values():
        if column.name not in schema.names and column.not_null and not column.has_default:
            problems.append(
                Mismatch(
                    f"column {column.name!r} is NOT NULL without a default but the "
                    "batch does not have it",
                    f"add column {column.name!r} to the query, or give it a default",
                )
            )
    return problems


def null_violations(batch: pa.RecordBatch, table: dict[str, TableColumn]) -> list[str]:
    """NOT NULL columns that hold nulls in this batch, with a count."""
    problems = []
    for name, array in zip(batch.schema.names, batch.columns, strict=True):
        column = table.get(name)
        if column is not None and column.not_null and array.null_count:
            problems.append(f"column {name!r} is NOT NULL but {array.null_count} rows hold null")
    return problems


def nul_characters(batch: pa.RecordBatch) -> list[str]:
    """Text columns holding U+0000, which Postgres text cannot store."""
    problems = []
    for name, array in zip(batch.schema.names, batch.columns, strict=True):
        if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
            hits = pc.sum(pc.match_substring(array, "\x00")).as_py() or 0
            if hits:
                problems.append(
                    f"column {name!r} has {hits} values containing the NUL "
                    "character (U+0000), which Postgres text cannot store"
                )
    return problems
