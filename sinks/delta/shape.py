"""What the table's rows look like, and each batch made to fit it before anything is written.

A batch fits when it has every column of the table (no more), each of the same Delta type or
one that widens losslessly to it (int32 -> long, float -> double, a column of only nulls), and
no null in a NOT NULL column. Types Delta has no form for are normalised first: timestamps to
microseconds (time zones to UTC, the same instants), large and view strings/binaries to their
plain forms, unsigned integers to the next wider signed one. A value that does not survive
(a nanosecond fraction, an unsigned 64-bit value above 2^63) refuses the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class Shape:
    """The table's Arrow schema (Delta's types) and its partition columns."""

    schema: pa.Schema
    partition_by: tuple[str, ...]

    @property
    def file_schema(self) -> pa.Schema:
        """What a data file holds: partition columns live in the log, not in the files."""
        import pyarrow as pa

        return pa.schema([f for f in self.schema if f.name not in self.partition_by])


def normalised_type(kind: pa.DataType) -> pa.DataType:
    import pyarrow as pa

    if pa.types.is_timestamp(kind):
        return pa.timestamp("us", "UTC" if kind.tz is not None else None)
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return pa.binary()
    widened = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64()}
    if kind in widened:
        return widened[kind]
    if pa.types.is_uint64(kind):
        return pa.int64()
    return kind


def normalised_schema(schema: pa.Schema) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([f.with_type(normalised_type(f.type)) for f in schema])


def delta_type(kind: pa.DataType) -> str | None:
    """Delta's name for an Arrow type (JSON), or None when Delta has none."""
    import json

    import pyarrow as pa
    from deltalake import Schema

    try:
        described = Schema.from_arrow(pa.schema([pa.field("x", kind)])).to_json()
    except Exception:  # noqa: BLE001 - delta-rs raises a plain Exception for foreign types
        return None
    return json.dumps(json.loads(described)["fields"][0]["type"], sort_keys=True)


def creatable(schema: pa.Schema, partition_by: Sequence[str]) -> list[str]:
    """Why a table cannot be created with this (normalised) schema: empty when it can."""
    import pyarrow as pa

    problems = []
    names = [f.name for f in schema]
    for field in schema:
        if pa.types.is_null(field.type):
            problems.append(
                f"column {field.name!r} holds only nulls and has no type (cast it in the query)"
            )
        elif delta_type(field.type) is None or "nanos" in (delta_type(field.type) or ""):
            problems.append(f"column {field.name!r} has type {field.type}, which Delta lacks")
    for column in partition_by:
        if column not in names:
            problems.append(f"partition column {column!r} is not a column of the rows")
        else:
            kind = schema.field(column).type
            if not (
                pa.types.is_string(kind)
                or pa.types.is_integer(kind)
                or pa.types.is_boolean(kind)
                or pa.types.is_date32(kind)
            ):
                problems.append(
                    f"partition column {column!r} has type {kind}: the Delta sink partitions "
                    "by strings, integers, booleans and dates"
                )
    if partition_by and len(partition_by) == len(names):
        problems.append("every column is a partition column: the data files would be empty")
    return problems


def conform(
    batch: pa.RecordBatch, shape: Shape, *, fill_missing: bool = False
) -> tuple[pa.RecordBatch | None, list[str]]:
    """The batch as the table's schema (columns in its order, its types), or the problems.
    With `fill_missing`, a nullable column the batch lacks is filled with nulls (as Delta's
    schema merge reads a file written before a column was added)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    problems = []
    given = {f.name: i for i, f in enumerate(batch.schema)}
    for name in given:
        if name not in shape.schema.names:
            problems.append(f"column {name!r} is not in the table")
    columns = []
    for field in shape.schema:
        index = given.get(field.name)
        if index is None:
            if fill_missing and field.nullable:
                columns.append(pa.nulls(batch.num_rows, field.type))
                continue
            problems.append(f"column {field.name!r} of the table is missing from the rows")
            continue
        column = batch.column(index)
        if not field.nullable and column.null_count:
            problems.append(
                f"column {field.name!r} is NOT NULL in the table but {column.null_count} rows "
                "hold null"
            )
        if column.type != field.type:
            if not _fits(column.type, field.type):
                problems.append(
                    f"column {field.name!r} has type {column.type}, the table {field.type}"
                )
                continue
            try:
                column = pc.cast(column, normalised_type(column.type), safe=True)
                column = pc.cast(column, field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                problems.append(f"column {field.name!r} does not fit {field.type}: {exc}")
                continue
        columns.append(column)
    if problems:
        return None, problems
    return pa.RecordBatch.from_arrays(columns, schema=shape.schema), []


def _fits(given: pa.DataType, wanted: pa.DataType) -> bool:
    import pyarrow as pa

    given = normalised_type(given)
    if given == wanted or pa.types.is_null(given):
        return True
    if pa.types.is_integer(given) and pa.types.is_integer(wanted):
        return bool(given.bit_width <= wanted.bit_width)
    if pa.types.is_floating(given) and pa.types.is_floating(wanted):
        return bool(given.bit_width <= wanted.bit_width)
    known = delta_type(given)
    return known is not None and known == delta_type(wanted)


def evolved(shape: Shape, schema: pa.Schema) -> tuple[Shape, list[str]]:
    """The table's shape with the batch's new columns added (schema evolution, add_columns):
    each as a nullable column of its normalised type, after the table's columns in the
    batch's order; and why the batch still cannot be taken (a new column Delta has no type
    for, a column wider than the table's). The shape is unchanged when nothing is new."""
    import pyarrow as pa

    problems = []
    added = []
    known = set(shape.schema.names)
    for field in schema:
        kind = normalised_type(field.type)
        if field.name in known:
            wanted = shape.schema.field(field.name).type
            if _widens(kind, wanted):
                problems.append(
                    f"column {field.name!r} has type {field.type}, the table {wanted}: widening "
                    "a Delta column needs the typeWidening table feature, which delta-rs cannot "
                    "write; cast the column to the table's type in the query, or widen the "
                    "column with Spark (ALTER TABLE ... SET TBLPROPERTIES "
                    "('delta.enableTypeWidening' = 'true'), then ALTER COLUMN ... TYPE)"
                )
            continue
        added.append(pa.field(field.name, kind, nullable=True))
    if not added:
        return shape, problems
    problems += creatable(pa.schema(added), ())
    return Shape(pa.schema([*shape.schema, *added]), shape.partition_by), problems


def _widens(given: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether `given` is a wider integer or float than the table's `wanted`."""
    import pyarrow as pa

    if pa.types.is_integer(given) and pa.types.is_integer(wanted):
        return bool(given.bit_width > wanted.bit_width)
    if pa.types.is_floating(given) and pa.types.is_floating(wanted):
        return bool(given.bit_width > wanted.bit_width)
    return False


def union(shapes: Sequence[Shape]) -> Shape | None:
    """The shapes' columns together: the first's in its order, then each later one's new
    columns (the participants of one epoch may each have added columns)."""
    import pyarrow as pa

    if not shapes:
        return None
    fields = list(shapes[0].schema)
    names = {f.name for f in fields}
    for shape in shapes[1:]:
        for field in shape.schema:
            if field.name not in names:
                fields.append(field)
                names.add(field.name)
    return Shape(pa.schema(fields), shapes[0].partition_by)


def conflicts(base: Shape | None, shapes: Sequence[Shape], *, complete: bool) -> list[str]:
    """Why files in `shapes` (the participants' of one epoch) cannot all join a table of
    shape `base` (None: the table is made by this epoch, from the first of `shapes`): a
    column of one type in one and of another type in another (each added it on its own), a
    different partitioning, and with `complete` (a merge, which would set a column missing
    from the rows to null) a column of the table missing from one. Empty when they fit."""
    if not shapes:
        return []
    known = base if base is not None else shapes[0]
    types = {f.name: delta_type(f.type) for f in known.schema}
    problems: list[str] = []
    for shape in {id(shape): shape for shape in shapes}.values():  # each distinct one once
        if tuple(shape.partition_by) != tuple(known.partition_by):
            problems.append(
                f"the files are partitioned by {list(shape.partition_by)}, the table by "
                f"{list(known.partition_by)}"
            )
        for field in shape.schema:
            kind = delta_type(field.type)
            wanted = types.setdefault(field.name, kind)
            if kind != wanted:
                shown, table = (str(k).strip('"') for k in (kind, wanted))
                problems.append(
                    f"column {field.name!r} is {shown} in some files and {table} in the table "
                    "or other files"
                )
        if complete and base is not None:
            missing = [n for n in base.schema.names if n not in shape.schema.names]
            problems += [f"column {n!r} of the table is missing from the rows" for n in missing]
    return sorted(set(problems))


def adds_columns(table: pa.Schema, shape: Shape) -> bool:
    """Whether `shape` has columns the table's schema lacks."""
    return bool(set(shape.schema.names) - set(table.names))
