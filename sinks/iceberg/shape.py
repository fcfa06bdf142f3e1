"""Whether an epoch's rows fit an Iceberg table: the same columns, each in a type that casts
into the table's without losing values, no null in a required column. Checked before any data
file of the rows is written, so rows that do not fit commit nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durable_sinks.core.errors import SchemaMismatchError

if TYPE_CHECKING:
    import pyarrow as pa


def fitted(rows: pa.Table, wanted: pa.Schema, table: str, where: dict[str, Any]) -> pa.Table:
    """`rows` as the table's Arrow schema `wanted` (same columns, safely cast), else a
    SchemaMismatchError naming every problem, `table` and `where` (job, sink, epoch)."""
    import pyarrow as pa

    problems = [f"column {n!r} is missing" for n in wanted.names if n not in rows.schema.names]
    problems += [
        f"column {n!r} is not in the table" for n in rows.schema.names if n not in wanted.names
    ]
    if not problems:
        for field in wanted:
            column = rows.column(field.name)
            if not field.nullable and column.null_count:
                problems.append(f"column {field.name!r} is required but holds null")
            elif not castable(column.type, field.type):
                problems.append(
                    f"column {field.name!r} is {column.type}, the table's is {field.type}"
                )
    if problems:
        raise SchemaMismatchError(
            f"the rows do not fit the Iceberg table {table}: " + "; ".join(problems),
            **where,
            fix="select and cast the columns to the table's schema in the query; nothing "
            "of the epoch was committed",
        )
    try:
        return rows.select(wanted.names).cast(wanted)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaMismatchError(
            f"the rows do not fit the Iceberg table {table}: {exc}",
            **where,
            fix="cast the columns to the table's types in the query",
        ) from exc


def castable(given: Any, wanted: Any) -> bool:
    """Whether a column of type `given` goes into one of `wanted` without losing values."""
    import pyarrow as pa

    if given == wanted:
        return True
    strings = (pa.string(), pa.large_string(), pa.string_view())
    if given in strings and wanted in strings:
        return True
    binaries = (pa.binary(), pa.large_binary())
    if given in binaries and wanted in binaries:
        return True
    if pa.types.is_integer(given) and pa.types.is_integer(wanted):
        return bool(given.bit_width <= wanted.bit_width) and (
            pa.types.is_signed_integer(wanted) or not pa.types.is_signed_integer(given)
        )
    if pa.types.is_floating(given) and pa.types.is_floating(wanted):
        return bool(given.bit_width <= wanted.bit_width)
    if pa.types.is_timestamp(given) and pa.types.is_timestamp(wanted):
        return (given.tz is None) == (wanted.tz is None)
    if pa.types.is_list(given) or pa.types.is_struct(given) or pa.types.is_map(given):
        return given.equals(wanted, check_metadata=False) or str(given) == str(wanted)
    return False
