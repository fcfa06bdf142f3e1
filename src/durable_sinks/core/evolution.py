"""Schema evolution of the sinks that write self-describing files (Parquet on S3 and local
files): how a dataset's schema grows batch by batch under `schema_evolution="add_columns"`,
and how a reader unifies the schemas its files were written with.

The rules, one for writers and readers alike:

- a column the dataset does not have yet is added at the end, nullable (earlier rows read as
  null);
- a column of the dataset that a batch lacks is null in that batch's rows;
- a column may widen safely: a signed integer to a wider signed integer (int32 -> int64), an
  unsigned integer to a wider unsigned or a strictly wider signed one, a float to a wider
  float (float32 -> float64); every value of the narrower type is a value of the wider one;
- a column that is not null everywhere becomes nullable when a batch has nulls in it or lacks
  it;
- any other change (int64 -> int32, int -> float, int -> string, a changed struct, list or
  map) is refused: SchemaMismatchError naming the column and the fix, raised before anything
  of the batch is written.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .errors import SchemaMismatchError

if TYPE_CHECKING:
    import pyarrow as pa

#: What a refused change says to do.
EVOLUTION_FIX = (
    "only new columns, missing columns (written as null) and safe widenings (int32 -> int64, "
    "float32 -> float64) evolve a dataset: cast the column back to its type in the query, or "
    "write the changed schema to a new path"
)


def _int_width(t: pa.DataType) -> tuple[bool, int] | None:
    """(signed, bits) of an integer type, None for anything else."""
    import pyarrow as pa

    if pa.types.is_signed_integer(t):
        return True, t.bit_width
    if pa.types.is_unsigned_integer(t):
        return False, t.bit_width
    return None


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every value of `old` is a value of `new` with the same meaning (old == new
    included)."""
    import pyarrow as pa

    if old.equals(new):
        return True
    a, b = _int_width(old), _int_width(new)
    if a is not None and b is not None:
        (old_signed, old_bits), (new_signed, new_bits) = a, b
        if old_signed == new_signed:
            return new_bits > old_bits
        return not old_signed and new_signed and new_bits > old_bits
    if pa.types.is_floating(old) and pa.types.is_floating(new):
        return bool(new.bit_width > old.bit_width)
    return False


def _wider(column: str, a: pa.DataType, b: pa.DataType, where: dict[str, Any]) -> pa.DataType:
    if widens(a, b):
        return b
    if widens(b, a):
        return a
    raise SchemaMismatchError(
        f"column {column!r} changes type from {a} to {b}, which is not a safe widening",
        fix=EVOLUTION_FIX,
        **where,
    )


def evolve(current: pa.Schema, batch: pa.Schema, **where: Any) -> pa.Schema:
    """The dataset's schema after a batch of schema `batch` (see the module docs for the
    rules): `current`'s columns in their order, widened where the batch widens them, then the
    batch's new columns in its order. Raises SchemaMismatchError for any other change, naming
    `where` (job, sink, epoch)."""
    import pyarrow as pa

    theirs = {f.name: f for f in batch}
    if len(theirs) != len(batch):
        raise SchemaMismatchError(
            "the batch has two columns of the same name",
            fix="rename one of them in the query",
            **where,
        )
    fields = []
    for field in current:
        other = theirs.get(field.name)
        if other is None:
            fields.append(field.with_nullable(True))
            continue
        wider = _wider(field.name, field.type, other.type, where)
        fields.append(pa.field(field.name, wider, field.nullable or other.nullable, field.metadata))
    mine = set(current.names)
    fields += [f.with_nullable(True) for f in batch if f.name not in mine]
    return pa.schema(fields, metadata=current.metadata)


def unify(schemas: Iterable[pa.Schema], **where: Any) -> pa.Schema | None:
    """The schema that holds every one of `schemas` (in order: the first one's columns first),
    by the rules of `evolve`; None for none. Raises SchemaMismatchError for a change no rule
    allows."""
    unified: pa.Schema | None = None
    for schema in schemas:
        unified = schema if unified is None else evolve(unified, schema, **where)
    return unified


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` in `schema` (a schema `evolve` made from it): its columns in the schema's
    order, widened, and null columns for those it lacks."""
    import pyarrow as pa

    if batch.schema.equals(schema):
        return batch
    columns = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            columns.append(pa.nulls(batch.num_rows, field.type))
            continue
        column = batch.column(index)
        columns.append(column if column.type.equals(field.type) else column.cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def evolved(
    current: pa.Schema | None, batch: pa.RecordBatch, **where: Any
) -> tuple[pa.Schema, pa.RecordBatch]:
    """A dataset sink's next batch: the dataset's schema evolved by `batch` (the batch's own
    when the dataset has none yet) and `batch` conformed to it. SchemaMismatchError, naming
    `where`, for a change that is not an evolution: raised before anything is written."""
    if current is None:
        return batch.schema, batch
    schema = evolve(current, batch.schema, **where)
    return schema, conform(batch, schema)


def schema_text(schema: pa.Schema) -> str:
    """A schema as text (base64 of its Arrow IPC form), for JSON markers."""
    import base64

    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_of_text(text: str) -> pa.Schema:
    """The schema `schema_text` wrote; ValueError if `text` is not one."""
    import base64
    import binascii

    import pyarrow as pa

    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))
    except (binascii.Error, pa.ArrowInvalid) as exc:
        raise ValueError(f"not an Arrow schema: {exc}") from exc
