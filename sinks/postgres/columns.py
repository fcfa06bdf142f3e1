"""Arrow -> Postgres type mapping for binary COPY (through pgpq); the checks that turn a batch
that does not fit its table into a SchemaMismatchError naming the column; the checks of
values before COPY that name the rows a table cannot take (`bad_values`); and what schema
evolution changes in a table (`evolution`) or in a batch (`cast_up`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

import pgpq
import pyarrow as pa
import pyarrow.compute as pc

from durable_sinks.core.bad_rows import Refusal, RefusalReason, RefusedRows

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


#: Widenings schema evolution makes (the table's base type, the type the batch needs): every
#: value of the old type is a value of the new one.
_WIDENINGS = {
    ("smallint", "integer"),
    ("smallint", "bigint"),
    ("integer", "bigint"),
    ("real", "double precision"),
}


def _cast_ups() -> dict[tuple[pa.DataType, str], pa.DataType]:
    return {
        (pa.int16(), "integer"): pa.int32(),
        (pa.int16(), "bigint"): pa.int64(),
        (pa.int32(), "bigint"): pa.int64(),
        (pa.float32(), "double precision"): pa.float64(),
    }


#: (a batch column's Arrow type, the table column's base type) -> the Arrow type it is cast
#: to under schema evolution: a batch narrower than a column widened before (every value of
#: the narrower type is one of the wider).
CAST_UPS = _cast_ups()


def cast_up(batch: pa.RecordBatch, table: dict[str, TableColumn]) -> pa.RecordBatch:
    """`batch` with each column narrower than its (widened) table column cast to the wider
    type (schema_evolution="add_columns"); the same batch when none is."""
    wider = {}
    for field in batch.schema:
        column = table.get(field.name)
        if column is not None:
            target = CAST_UPS.get((field.type, column.base_type))
            if target is not None:
                wider[field.name] = target
    if not wider:
        return batch
    return pa.record_batch(
        [
            array.cast(wider[name]) if name in wider else array
            for name, array in zip(batch.schema.names, batch.columns, strict=True)
        ],
        schema=pa.schema(
            [f.with_type(wider[f.name]) if f.name in wider else f for f in batch.schema]
        ),
    )


@dataclass(frozen=True)
class Evolution:
    """One change schema evolution makes to a table: add a nullable column ("add") or widen
    a column's type ("widen"), to `type` (a CREATE TABLE type, see `ddl_type`)."""

    kind: str
    column: str
    type: str

    def needed(self, table: dict[str, TableColumn]) -> bool:
        """Whether `table` (as read now) still needs this change."""
        column = table.get(self.column)
        if self.kind == "add":
            return column is None
        return column is not None and (column.base_type, self.type) in _WIDENINGS


def evolution(schema: pa.Schema, table: dict[str, TableColumn]) -> list[Evolution]:
    """The changes that make `table` take batches of `schema` (schema_evolution=
    "add_columns"): each batch column the table lacks, added as a nullable column of the type
    CREATE TABLE gives it; each smallint/integer column the batch has as a wider integer,
    and each real column it has as double, widened. Anything else (a column the sink has no
    type for, a narrowing, another type) is left to `mismatches` to refuse."""
    changes = []
    for field in schema:
        wanted = _ddl_or_none(field)
        if wanted is None:
            continue  # no column type for it: `mismatches` says so
        column = table.get(field.name)
        if column is None:
            changes.append(Evolution("add", field.name, wanted))
        elif (column.base_type, wanted) in _WIDENINGS:
            changes.append(Evolution("widen", field.name, wanted))
    return changes


def _ddl_or_none(field: pa.Field) -> str | None:
    try:
        return ddl_type(field)
    except Exception:  # noqa: BLE001 - ddl_type's TypeError and pgpq's own errors
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


#: What Postgres holds, per Arrow unit, as [first, end) of the Arrow value (since 1970-01-01):
#: timestamps from 4714-11-24 BC (Julian day 0) to before 294277-01-01, dates to 5874897-12-31
#: (src/include/datatype/timestamp.h: MIN_TIMESTAMP, END_TIMESTAMP, DATE_END_JULIAN). pgpq
#: shifts each value to Postgres's epoch (2000-01-01) and to microseconds: a value past these
#: bounds is refused by the server, fails pgpq's encoding, or (the one value that lands on
#: Postgres's -infinity) would be stored as -infinity.
_TIMESTAMP_BOUNDS: dict[str, tuple[int, int | None]] = {
    "s": (-210_866_803_200, 9_224_318_016_000),
    "ms": (-210_866_803_200_000, 9_224_318_016_000_000),
    # The end is past int64's microseconds since 1970, so there is no upper bound.
    "us": (-210_866_803_200_000_000, None),
}
_DATE_BOUNDS: tuple[int, int | None] = (-2_440_588, 2_145_042_906)
#: The length limit of character varying(n) / character(n).
_LENGTH_LIMITED = re.compile(r"^(character varying|character)\((\d+)\)$")


def bad_values(batch: pa.RecordBatch, table: dict[str, TableColumn]) -> RefusedRows:
    """The rows of `batch` the table's columns cannot take, checked before COPY with Arrow
    compute (one pass per checked column, nothing per row in Python): a null in a NOT NULL
    column, U+0000 in text, a string longer than varchar(n) / char(n) in characters (trailing
    blanks beyond n are cut, as Postgres does), a decimal with more integer digits than
    numeric(p,s) holds, a date or timestamp outside what Postgres holds. A row with several
    problems is refused for the first column found (in batch order). What only the server
    judges (keys, constraints, triggers) is not checked here."""
    found: list[RefusedRows] = []
    for name, array in zip(batch.schema.names, batch.columns, strict=True):
        column = table.get(name)
        if column is None:
            continue
        if column.not_null and array.null_count:
            found.append(RefusedRows.where(pc.is_null(array), _not_null(name)))
        kind = array.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            found.extend(_text_refusals(array, column))
        elif pa.types.is_decimal(kind):
            found.extend(_numeric_refusals(array, column))
        elif pa.types.is_timestamp(kind) or pa.types.is_date32(kind):
            found.extend(_datetime_refusals(array, column))
    return RefusedRows().merged(*found) if found else RefusedRows()


def _not_null(name: str) -> Refusal:
    return Refusal(
        RefusalReason.NOT_NULL,
        f'null value in column "{name}" violates not-null constraint',
        column=name,
    )


def _text_refusals(array: pa.Array, column: TableColumn) -> list[RefusedRows]:
    name = column.name
    found = []
    # A scan of the raw bytes of this array's values first (memchr speed): the per-value
    # scan runs only when some byte is 0 (maybe in a null's bytes).
    if _has_zero_byte(array):
        nul = pc.match_substring(array, "\x00")
        found.append(
            RefusedRows.where(
                nul,
                Refusal(
                    RefusalReason.NUL_CHARACTER,
                    f'text in column "{name}" holds the NUL character (U+0000), which '
                    "Postgres text cannot store",
                    column=name,
                ),
            )
        )
    limited = _LENGTH_LIMITED.match(column.type)
    if limited is not None:
        limit = int(limited.group(2))
        # No value has more characters than bytes: the byte lengths (read off the offsets)
        # clear most batches without decoding any UTF-8.
        if (pc.max(pc.binary_length(array)).as_py() or 0) <= limit:
            return found
        longer = pc.greater(pc.utf8_length(array), limit)
        if pc.any(longer).as_py():
            # Postgres cuts a value whose characters beyond n are all blanks.
            trimmed = pc.greater(pc.utf8_length(pc.utf8_rtrim(array, " ")), limit)
            found.append(
                RefusedRows.where(
                    pc.and_(longer, trimmed),
                    Refusal(
                        RefusalReason.TOO_LONG,
                        f"value too long for type {column.type} (more than {limit} characters)",
                        column=name,
                    ),
                )
            )
    return found


def _has_zero_byte(array: pa.Array) -> bool:
    data = array.buffers()[2]
    if data is None or len(array) == 0:
        return False
    # The value offsets (positions in `data`) of this array, which may be a slice of another.
    width = pa.int64() if pa.types.is_large_string(array.type) else pa.int32()
    offsets = pa.Array.from_buffers(
        width, len(array) + 1, [None, array.buffers()[1]], offset=array.offset
    )
    first, end = offsets[0].as_py(), offsets[len(array)].as_py()
    return bool(data.slice(first, end - first).to_pybytes().find(b"\x00") >= 0)


def _numeric_refusals(array: pa.Array, column: TableColumn) -> list[RefusedRows]:
    typmod = numeric_typmod(column.type)
    if typmod is None:
        return []
    precision, scale = typmod
    digits = precision - scale  # integer digits the column holds
    kind = array.type
    if kind.precision - kind.scale <= digits:
        return []  # no value of the batch's type can have more
    # The batch's scale is at most the column's (a larger one is refused by `mismatches`),
    # so Postgres does not round: a value overflows when |v| >= 10^digits.
    over = pc.greater_equal(pc.abs(array), pa.scalar(Decimal(10) ** digits, kind))
    if not pc.any(over).as_py():
        return []
    return [
        RefusedRows.where(
            over,
            Refusal(
                RefusalReason.OUT_OF_RANGE,
                f"numeric field overflow: a field with precision {precision}, scale {scale} "
                f"must round to an absolute value less than 10^{digits}",
                column=column.name,
            ),
        )
    ]


def _datetime_refusals(array: pa.Array, column: TableColumn) -> list[RefusedRows]:
    kind = array.type
    first: int
    end: int | None
    if pa.types.is_date32(kind):
        first, end = _DATE_BOUNDS
        values = array.cast(pa.int32())
        what = "date out of range (Postgres holds 4713 BC to 5874897 AD)"
    else:
        bounds = _TIMESTAMP_BOUNDS.get(kind.unit)
        if bounds is None:
            return []  # pgpq does not encode it: `mismatches` refused the batch
        first, end = bounds
        values = array.cast(pa.int64())
        what = "timestamp out of range (Postgres holds 4713 BC to 294276 AD)"
    outside = pc.less(values, first)
    if end is not None:
        outside = pc.or_(outside, pc.greater_equal(values, end))
    if not pc.any(outside).as_py():
        return []
    return [
        RefusedRows.where(
            outside, Refusal(RefusalReason.TIMESTAMP_OUT_OF_RANGE, what, column=column.name)
        )
    ]
