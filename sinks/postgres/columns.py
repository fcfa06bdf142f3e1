"""Arrow -> Postgres type mapping for binary COPY (through pgpq), and the checks that turn a
batch that does not fit its table into a SchemaMismatchError naming the column."""

from __future__ import annotations

from dataclasses import dataclass

import pgpq
import pyarrow as pa
import pyarrow.compute as pc

# pgpq's encoder type -> the Postgres types whose binary input accepts its bytes.
_BINARY_COMPATIBLE = {
    "Bool": {"boolean"},
    "Bytea": {"bytea"},
    "Int2": {"smallint"},
    "Int4": {"integer"},
    "Int8": {"bigint"},
    "Float4": {"real"},
    "Float8": {"double precision"},
    "Numeric": {"numeric"},
    "Text": {"text", "character varying", "name"},
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


@dataclass(frozen=True)
class TableColumn:
    name: str
    type: str  # format_type(), e.g. "bigint", "timestamp with time zone"
    not_null: bool
    has_default: bool


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


def mismatches(schema: pa.Schema, table: dict[str, TableColumn]) -> list[str]:
    """Every way the batch schema does not fit the table, one sentence each."""
    problems = []
    for field in schema:
        column = table.get(field.name)
        if column is None:
            problems.append(f"column {field.name!r} is not in the table")
            continue
        try:
            kind = encoder_type(field)
        except Exception:  # noqa: BLE001 - pgpq raises plain exceptions for unsupported types
            problems.append(
                f"column {field.name!r} has Arrow type {field.type}, which binary "
                "COPY cannot encode"
            )
            continue
        accepted = _BINARY_COMPATIBLE.get(kind, set())
        if column.type not in accepted:
            wanted = " or ".join(sorted(accepted)) or kind
            problems.append(
                f"column {field.name!r} is {column.type} in the table but the batch has Arrow "
                f"{field.type} (encoded as {wanted})"
            )
    for column in table.values():
        if column.name not in schema.names and column.not_null and not column.has_default:
            problems.append(
                f"column {column.name!r} is NOT NULL without a default but the "
                "batch does not have it"
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
