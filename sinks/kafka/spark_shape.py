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

What Spark would fail a task on mid-write is refused here for the whole batch before any of
its records is produced (so nothing of the epoch becomes visible): a header with a null key
or a null header entry, a negative partition (a partition the topic does not have is refused
by the sink, which knows the topic's partitions). A wrong column type is refused from the
schema alone, once per schema.

The sink writes one topic: its `topic` option, which, as in Spark, takes precedence over a
`topic` column. Spark then sends every row to the option's topic whatever the column says;
this sink refuses a row whose `topic` names another topic instead of redirecting it (a null
`topic` means the sink's topic), since a job that fills the column expects it honoured.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from .records import Records, byte_lengths, epoch_millis, fold_crc

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


def row_problems(batch: pa.RecordBatch, topic: str) -> list[str]:
    """What in the rows of `batch` (whose schema passed `schema_problems`) the sink cannot
    write into `topic`, with the first offending row; empty when every row can be written."""
    found: list[str] = []
    names = batch.schema.names
    if TOPIC in names:
        column = batch.column(TOPIC)
        other = pc.and_(pc.is_valid(column), pc.not_equal(column, pa.scalar(topic, column.type)))
        row = _first(other)
        if row is not None:
            found.append(
                f"row {row} has topic {column[row].as_py()!r}, but the sink writes topic "
                f"{topic!r} only (its topic option takes precedence over the 'topic' column, "
                "and it does not redirect rows)"
            )
    if PARTITION in names:
        row = _first(pc.less(batch.column(PARTITION), 0))
        if row is not None:
            found.append(
                f"row {row} has partition {batch.column(PARTITION)[row].as_py()}; partitions "
                "are numbered from 0"
            )
    if HEADERS in names:
        headers = batch.column(HEADERS)
        entries = pc.list_flatten(headers)
        null_entry = pc.is_null(entries)
        null_key = pc.is_null(pc.struct_field(entries, 0))
        bad = _first(pc.or_(null_entry, null_key))
        if bad is not None:
            row = pc.list_parent_indices(headers)[bad].as_py()
            what = "a null header" if null_entry[bad].as_py() else "a header with a null key"
            found.append(f"row {row} has {what} in 'headers'; a Kafka header needs a key")
    return found


def _first(mask: pa.Array) -> int | None:
    """Index of the first true value of a boolean array (nulls count as false)."""
    filled = pc.fill_null(mask, False)
    if not pc.any(filled).as_py():
        return None
    return int(pc.index(filled, True).as_py())


def build_spark_records(batch: pa.RecordBatch, checksum: int) -> Records:
    """The batch's records as Spark's Kafka sink writes them (the batch must have passed
    `schema_problems` and `row_problems`). `checksum` is the running CRC-32 of the epoch's
    values and keys; the returned Records carry it updated with this batch."""
    names = batch.schema.names
    value_array = batch.column(VALUE)
    values = value_array.to_pylist()
    sizes = byte_lengths(value_array)
    checksum = fold_crc(value_array, checksum)
    keys = None
    if KEY in names:
        key_array = batch.column(KEY)
        keys = key_array.to_pylist()
        sizes = pc.add(sizes, byte_lengths(key_array))
        checksum = fold_crc(key_array, checksum)
    headers = None
    if HEADERS in names:
        headers, header_sizes = _headers(batch.column(HEADERS))
        sizes = pc.add(sizes, header_sizes)
    timestamps = epoch_millis(batch.column(TIMESTAMP)) if TIMESTAMP in names else None
    partitions = None
    if PARTITION in names:
        partitions = pc.fill_null(batch.column(PARTITION), -1).to_pylist()
    return Records(
        values, keys, headers, timestamps, partitions, sizes, checksum, own_headers_first=True
    )


def _headers(array: pa.Array) -> tuple[list[list[tuple[str, bytes | None]]], pa.Array]:
    """Each row's headers as (key, value) pairs in order, and their bytes (keys UTF-8)."""
    rows: list[list[tuple[str, bytes | None]]] = []
    sizes: list[int] = []
    for entries in array.to_pylist():
        pairs = [(entry["key"], entry["value"]) for entry in entries or ()]
        rows.append(pairs)
        sizes.append(sum(len(k.encode()) + len(v or b"") for k, v in pairs))
    return rows, pa.array(sizes, pa.int64())
