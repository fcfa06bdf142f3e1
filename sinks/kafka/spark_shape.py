"""Spark's Kafka record shape: a batch with the columns Spark's own Kafka sink reads
(`df.write.format("kafka")`), turned into the records that sink would write.

The rules are those of Spark's KafkaWriter (which types it accepts) and KafkaWriteTask (what a
row becomes):
- `value`: string or binary, required; a null value is a record without a value (a tombstone);
- `key`: string or binary, optional; null or absent: a record without a key;
- `headers`: array<struct<key: string, value: binary>>, optional; each row's headers in their
  order; a null array: no headers; a header's value may be null;
- `partition`: int, optional; null or absent: the partitioner's choice (the key's hash);
- `timestamp`: timestamp, optional; the record's timestamp in milliseconds (finer digits
  dropped); null or absent: the producer's clock (Spark 4.2's sink ignores this column);
- `topic`: string, optional; see below;
- any other column: ignored, as Spark ignores it.
Strings are sent UTF-8 encoded, binary values byte for byte.

What Spark would fail a task on mid-write is a refused row here (`row_refusals`), found
before any record of the batch is produced: a header with a null key or a null header entry,
a partition the topic does not have (negative, or beyond its count). By the job's bad-row
policy such a row fails the epoch (nothing of it becomes visible) or goes to the dead letter.
A wrong column type is refused from the schema alone, once per schema.

Topics are Spark's rule: with the sink's `topic` option every row goes to that topic and the
`topic` column is ignored; without it each row goes to the topic its `topic` column names
(the sink routes the rows, sink.py: a null topic, or one the sink may not write, is a bad
row).
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from durable_sinks.core.bad_rows import Refusal, RefusalReason, RefusedRows

from .records import HEADER_OVERHEAD, RECORD_OVERHEAD, Encoded, Records, byte_lengths

#: Spark's column names.
VALUE, KEY, HEADERS, PARTITION, TIMESTAMP, TOPIC = (
    "value",
    "key",
    "headers",
    "partition",
    "timestamp",
    "topic",
)
#: The Spark type each column must have, as Spark names it.
SPARK_TYPES = {
    VALUE: "string or binary",
    KEY: "string or binary",
    HEADERS: "array<struct<key:string,value:binary>>",
    PARTITION: "int",
    TIMESTAMP: "timestamp",
    TOPIC: "string",
}
#: The Arrow types Spark sends each Spark type as (plain, large or view variants).
_STRING: tuple[Callable[[pa.DataType], bool], ...] = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_string_view,
)
_BINARY: tuple[Callable[[pa.DataType], bool], ...] = (
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_binary_view,
)


def _is_string(type_: pa.DataType) -> bool:
    return any(check(type_) for check in _STRING)


def _is_binary(type_: pa.DataType) -> bool:
    return any(check(type_) for check in _BINARY)


def _is_headers(type_: pa.DataType) -> bool:
    if not (pa.types.is_list(type_) or pa.types.is_large_list(type_)):
        return False
    entry = type_.value_type
    return (
        pa.types.is_struct(entry)
        and entry.num_fields == 2
        and entry.field(0).name == "key"
        and _is_string(entry.field(0).type)
        and entry.field(1).name == "value"
        and _is_binary(entry.field(1).type)
    )


_ACCEPTS: dict[str, Callable[[pa.DataType], bool]] = {
    VALUE: lambda t: _is_string(t) or _is_binary(t),
    KEY: lambda t: _is_string(t) or _is_binary(t),
    HEADERS: _is_headers,
    PARTITION: pa.types.is_int32,
    TIMESTAMP: pa.types.is_timestamp,
    TOPIC: _is_string,
}


def schema_problems(schema: pa.Schema) -> list[str]:
    """What keeps `schema` from being Spark's Kafka record shape (empty when it is): a
    missing `value` column, a Spark column of another type."""
    repeated = [name for name in _ACCEPTS if schema.names.count(name) > 1]
    if repeated:
        return [f"the batch has more than one column named each of {repeated}"]
    found: list[str] = []
    if VALUE not in schema.names:
        found.append(f"Spark's Kafka record shape needs a 'value' column (columns: {schema.names})")
    for name, accepts in _ACCEPTS.items():
        index = schema.get_field_index(name)
        if index >= 0 and not accepts(schema.field(index).type):
            found.append(
                f"column {name!r} is {schema.field(index).type}; Spark's Kafka record shape "
                f"needs {SPARK_TYPES[name]}"
            )
    return found


def row_refusals(batch: pa.RecordBatch, topic: str, partitions: int) -> RefusedRows:
    """The rows of `batch` (whose schema passed `schema_problems`) the sink cannot write
    into `topic` (which has `partitions` partitions), each with why (INVALID_VALUE): a
    partition the topic does not have, a null header or a header with a null key.
    Vectorized; nothing per row in Python but the refused rows' messages."""
    found: list[RefusedRows] = []
    names = batch.schema.names
    if PARTITION in names:
        column = batch.column(PARTITION)
        outside = pc.or_(pc.less(column, 0), pc.greater_equal(column, partitions))
        found.append(
            _each(
                outside,
                lambda row: Refusal(
                    RefusalReason.INVALID_VALUE,
                    f"partition {column[row].as_py()}, but topic {topic!r} has partitions "
                    f"0..{partitions - 1}",
                    PARTITION,
                ),
            )
        )
    if HEADERS in names:
        headers = batch.column(HEADERS)
        entries = pc.list_flatten(headers)
        if len(entries):
            null_entry = pc.is_null(entries)
            bad = pc.or_(null_entry, pc.is_null(pc.struct_field(entries, 0)))
            hits = pc.indices_nonzero(pc.fill_null(bad, True))
            parents = pc.take(pc.list_parent_indices(headers), hits).to_pylist()
            nulls = pc.take(null_entry, hits).to_pylist()
            found.append(
                RefusedRows.of(
                    (
                        row,
                        Refusal(
                            RefusalReason.INVALID_VALUE,
                            ("a null header" if null else "a header with a null key")
                            + " in 'headers'; a Kafka header needs a key",
                            HEADERS,
                        ),
                    )
                    for row, null in zip(parents, nulls, strict=True)
                )
            )
    return RefusedRows().merged(*found)


def _each(mask: pa.Array, refusal: Callable[[int], Refusal]) -> RefusedRows:
    """The rows where `mask` is true (nulls count as false), each with its own refusal."""
    hits = pc.indices_nonzero(pc.fill_null(mask, False)).to_pylist()
    return RefusedRows(tuple(hits), tuple(refusal(row) for row in hits))


def encode_spark_records(batch: pa.RecordBatch) -> Encoded:
    """The batch's records as Spark's Kafka sink writes them (the batch must have passed
    `schema_problems`; rows `row_refusals` names are still in)."""
    names = batch.schema.names
    value_array = batch.column(VALUE)
    sizes = byte_lengths(value_array)
    key_array = None
    if KEY in names:
        key_array = batch.column(KEY)
        sizes = pc.add(sizes, byte_lengths(key_array))
    header_lists = None
    wire_sizes = pc.add(sizes, RECORD_OVERHEAD)
    if HEADERS in names:
        header_lists = batch.column(HEADERS)
        header_bytes, count = _header_sizes(header_lists)
        sizes = pc.add(sizes, header_bytes)
        wire_sizes = pc.add(pc.add(wire_sizes, header_bytes), pc.multiply(count, HEADER_OVERHEAD))
    return Encoded(
        value_array,
        key_array,
        (),
        header_lists,
        batch.column(TIMESTAMP) if TIMESTAMP in names else None,
        batch.column(PARTITION) if PARTITION in names else None,
        sizes,
        wire_sizes,
        own_headers_first=True,
    )


def build_spark_records(batch: pa.RecordBatch, checksum: int) -> Records:
    """The batch's records as Spark's Kafka sink writes them. `checksum` is the running
    CRC-32 of the epoch's values and keys; the returned Records carry it updated."""
    return encode_spark_records(batch).records(checksum)


def _header_sizes(array: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Each row's headers' bytes (keys UTF-8, values as given) and count, as int64 arrays."""
    import numpy as np

    entries = pc.list_flatten(array)
    counts = pc.fill_null(pc.list_value_length(array), 0).cast(pa.int64())
    if len(entries) == 0:
        return pa.array(np.zeros(len(array), dtype=np.int64)), counts
    each = pc.add(
        byte_lengths(pc.struct_field(entries, 0)), byte_lengths(pc.struct_field(entries, 1))
    )
    parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
    weights = each.to_numpy(zero_copy_only=False)
    summed = np.bincount(parents, weights=weights, minlength=len(array))
    return pa.array(summed.astype(np.int64)), counts
