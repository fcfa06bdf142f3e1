"""Arrow rows to Kafka records in the JSON record shape: which column becomes the value, key,
headers, timestamp and partition (the `*_column` options), checked against the batch's schema
before anything is produced. The other shape, Spark's own Kafka sink's columns, is
spark_shape.py; `config.record_shape_of` chooses between them.

The conversion works column by column (Arrow to Python lists in C), so the only per-row Python
work left is the `produce` call itself. The JSON value form (every column not used for
something else, as one JSON object per row) is the exception: it builds one dict per row and
is several times slower; give a bytes or string value column for throughput.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import repeat
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: The header every record carries with `epoch_header=True`: the epoch that wrote it (decimal
#: ASCII).
EPOCH_HEADER = "ds-epoch"


#: What a record costs beyond its key, value and own headers when checked against the size
#: limits, generously: librdkafka counts its largest record framing (41 bytes) and the epoch
#: header (`ds-epoch` and up to 20 digits, with their length varints) against the producer's
#: message.max.bytes; the broker counts the record batch's 61-byte header and the record
#: against the topic's max.message.bytes when a record travels alone in its batch.
RECORD_OVERHEAD = 128
#: What each of a record's own headers costs beyond its key and value (two length varints).
HEADER_OVERHEAD = 10

_BYTES_TYPES: tuple[Callable[[pa.DataType], bool], ...] = (
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary_view,
    pa.types.is_string_view,
)


def _is_bytes_like(type_: pa.DataType) -> bool:
    return any(check(type_) for check in _BYTES_TYPES)


@dataclass(frozen=True)
class RecordLayout:
    """Which columns make up a record. `value_column` None means a JSON object of every
    column that no other role uses."""

    value_column: str | None = None
    key_column: str | None = None
    header_columns: tuple[str, ...] = ()
    timestamp_column: str | None = None
    partition_column: str | None = None
    #: The column naming each row's topic (a sink without a `topic` option).
    topic_column: str | None = None

    def roles(self) -> dict[str, str]:
        named = {
            "value_column": self.value_column,
            "key_column": self.key_column,
            "timestamp_column": self.timestamp_column,
            "partition_column": self.partition_column,
            "topic_column": self.topic_column,
        }
        roles = {column: role for role, column in named.items() if column is not None}
        for column in self.header_columns:
            roles[column] = "header_columns"
        return roles

    def problems(self, schema: pa.Schema) -> list[str]:
        """What keeps `schema` from fitting this layout (empty when it fits)."""
        found: list[str] = []
        for column, role in self.roles().items():
            index = schema.get_field_index(column)
            if index < 0:
                found.append(f"{role} {column!r} is not a column (columns: {schema.names})")
                continue
            type_ = schema.field(index).type
            if role == "topic_column":
                if not (pa.types.is_string(type_) or pa.types.is_large_string(type_)):
                    found.append(f"topic_column {column!r} is {type_}; it must be a string")
            elif role in ("value_column", "key_column", "header_columns"):
                if not _is_bytes_like(type_):
                    found.append(f"{role} {column!r} is {type_}; it must be string or binary")
            elif role == "timestamp_column":
                if not (pa.types.is_timestamp(type_) or pa.types.is_integer(type_)):
                    found.append(
                        f"timestamp_column {column!r} is {type_}; it must be a timestamp or an "
                        "integer of milliseconds since the Unix epoch"
                    )
            elif not pa.types.is_integer(type_):
                found.append(f"partition_column {column!r} is {type_}; it must be an integer")
        if self.value_column is None and not self.json_columns(schema):
            found.append("no column is left for the JSON value")
        return found

    def json_columns(self, schema: pa.Schema) -> list[str]:
        used = self.roles()
        return [name for name in schema.names if name not in used]


@dataclass
class Records:
    """One batch's records: values, keys and partitions as Arrow arrays (what the bulk call
    reads, bulk.py), as Python lists on first use (what `produce` takes); headers and
    timestamps as lists (None where a role is unused); each record's size (key + value +
    headers) as an Arrow array (no Python int per row)."""

    value_array: pa.Array
    key_array: pa.Array | None
    headers: list[list[tuple[str, Any]]] | None
    timestamps: list[int] | None
    #: Each record's partition; null: the partitioner's choice.
    partition_array: pa.Array | None
    sizes: pa.Array
    checksum: int
    #: Whether the record's own headers come before the epoch header (the Spark shape, so
    #: that a header keeps the index Spark's sink gives it); else the epoch header is first.
    own_headers_first: bool = False

    @cached_property
    def values(self) -> list[Any]:
        values: list[Any] = self.value_array.to_pylist()
        return values

    @cached_property
    def keys(self) -> list[Any] | None:
        if self.key_array is None:
            return None
        keys: list[Any] = self.key_array.to_pylist()
        return keys

    @cached_property
    def partitions(self) -> list[int] | None:
        """Each record's partition, -1 for the partitioner's choice."""
        if self.partition_array is None:
            return None
        filled: list[int] = pc.fill_null(self.partition_array, -1).to_pylist()
        return filled

    def __len__(self) -> int:
        return len(self.value_array)

    def total_bytes(self) -> int:
        total = pc.sum(self.sizes).as_py()
        return int(total or 0)

    def largest(self) -> tuple[int, int]:
        """(row, size) of the largest record; (0, 0) when there is none."""
        if len(self.sizes) == 0:
            return 0, 0
        size = int(pc.max(self.sizes).as_py())
        return int(pc.index(self.sizes, size).as_py()), size

    def produce_args(self) -> Iterator[tuple[Any, Any, list[tuple[str, Any]] | None, int, int]]:
        """(value, key, extra headers, timestamp ms or 0, partition or -1) per record."""
        n = len(self)
        return zip(
            self.values,
            self.keys if self.keys is not None else repeat(None, n),
            self.headers if self.headers is not None else repeat(None, n),
            self.timestamps if self.timestamps is not None else repeat(0, n),
            self.partitions if self.partitions is not None else repeat(-1, n),
            strict=True,
        )


@dataclass
class Encoded:
    """One batch's records as Arrow arrays, before any Python object per row: what the size
    and partition checks read, vectorized. `kept` drops refused rows in Arrow (no record is
    encoded twice); `records` makes the Python lists `produce` takes."""

    values: pa.Array
    keys: pa.Array | None
    #: Header columns of the JSON record shape: (header key, column of values).
    header_columns: tuple[tuple[str, pa.Array], ...]
    #: The `headers` column of Spark's record shape (list<struct<key, value>>).
    header_lists: pa.Array | None
    timestamps: pa.Array | None
    partitions: pa.Array | None
    #: Bytes of key + value + own headers per record.
    sizes: pa.Array
    #: What each record weighs against the size limits (sizes + framing, RECORD_OVERHEAD).
    wire_sizes: pa.Array
    own_headers_first: bool = False

    def __len__(self) -> int:
        return len(self.values)

    def kept(self, mask: pa.Array) -> Encoded:
        """These records but those where the boolean `mask` is false."""

        def keep(array: pa.Array | None) -> pa.Array | None:
            return None if array is None else array.filter(mask)

        return Encoded(
            self.values.filter(mask),
            keep(self.keys),
            tuple((name, column.filter(mask)) for name, column in self.header_columns),
            keep(self.header_lists),
            keep(self.timestamps),
            keep(self.partitions),
            self.sizes.filter(mask),
            self.wire_sizes.filter(mask),
            self.own_headers_first,
        )

    def records(self, checksum: int) -> Records:
        """The records `produce` takes. `checksum` is the running CRC-32 of the epoch's values
        and keys; the returned Records carry it updated with these."""
        checksum = fold_crc(self.values, checksum)
        if self.keys is not None:
            checksum = fold_crc(self.keys, checksum)
        headers: list[list[tuple[str, Any]]] | None = None
        if self.header_columns:
            names = [name for name, _ in self.header_columns]
            headers = [
                list(zip(names, row, strict=True))
                for row in zip(*(c.to_pylist() for _, c in self.header_columns), strict=True)
            ]
        elif self.header_lists is not None:
            headers = [
                [(entry["key"], entry["value"]) for entry in entries or ()]
                for entries in self.header_lists.to_pylist()
            ]
        timestamps = epoch_millis(self.timestamps) if self.timestamps is not None else None
        return Records(
            self.values,
            self.keys,
            headers,
            timestamps,
            self.partitions,
            self.sizes,
            checksum,
            own_headers_first=self.own_headers_first,
        )


def encode_records(batch: pa.RecordBatch, layout: RecordLayout) -> Encoded:
    """The batch's records in the JSON record shape (`layout` must fit its schema)."""
    if layout.value_column is not None:
        value_array = batch.column(layout.value_column)
    else:
        value_array = _json_values(batch, layout.json_columns(batch.schema))
    sizes = byte_lengths(value_array)
    key_array = None
    if layout.key_column is not None:
        key_array = batch.column(layout.key_column)
        sizes = pc.add(sizes, byte_lengths(key_array))
    columns = tuple((name, batch.column(name)) for name in layout.header_columns)
    for name, column in columns:
        sizes = pc.add(sizes, pc.add(byte_lengths(column), len(name.encode())))
    framing = RECORD_OVERHEAD + HEADER_OVERHEAD * len(columns)
    return Encoded(
        value_array,
        key_array,
        columns,
        None,
        batch.column(layout.timestamp_column) if layout.timestamp_column is not None else None,
        batch.column(layout.partition_column) if layout.partition_column is not None else None,
        sizes,
        pc.add(sizes, framing),
    )


def build_records(batch: pa.RecordBatch, layout: RecordLayout, checksum: int) -> Records:
    """The batch's records. `checksum` is the running CRC-32 of the epoch's values and keys;
    the returned Records carry it updated with this batch."""
    return encode_records(batch, layout).records(checksum)


def byte_lengths(array: pa.Array) -> pa.Array:
    """Encoded length of each string/binary value (0 for null), as int64."""
    lengths: pa.Array = pc.fill_null(pc.binary_length(array), 0).cast(pa.int64())
    return lengths


def fold_crc(array: pa.Array, checksum: int) -> int:
    """Fold the array's value bytes into a CRC-32, straight from its Arrow buffers."""
    if len(array) == 0:
        return checksum
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        array = array.cast(
            pa.large_binary() if pa.types.is_large_string(array.type) else pa.binary()
        )
    if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
        joined = b"".join(v for v in array.to_pylist() if v)
        return zlib.crc32(joined.encode() if isinstance(joined, str) else joined, checksum)
    offsets_buffer, data = array.buffers()[1], array.buffers()[2]
    width = 8 if pa.types.is_large_binary(array.type) else 4
    if offsets_buffer is None or data is None:
        return checksum
    offsets = memoryview(offsets_buffer).cast("q" if width == 8 else "i")
    start, end = offsets[array.offset], offsets[array.offset + len(array)]
    return zlib.crc32(memoryview(data)[start:end], checksum)


def epoch_millis(array: pa.Array) -> list[int]:
    """Milliseconds since the Unix epoch (0, meaning "now", for null); finer digits are
    dropped, as Spark's Kafka sink drops microseconds."""
    result: list[int] = pc.fill_null(millis(array), 0).to_pylist()
    return result


def millis(array: pa.Array) -> pa.Array:
    """Milliseconds since the Unix epoch as int64 (null stays null; finer digits dropped)."""
    if pa.types.is_timestamp(array.type):
        in_ms = pc.cast(array, pa.timestamp("ms", array.type.tz), safe=False)
        return pc.cast(in_ms, pa.int64())
    return array.cast(pa.int64())


def _json_values(batch: pa.RecordBatch, columns: Sequence[str]) -> pa.Array:
    """One compact JSON object per row, as a binary array. Timestamps and dates become ISO
    8601 strings in Arrow (UTC timestamps with `+00:00`, naive ones without an offset, every
    digit of the column's unit). The bytes are orjson's for the row as a dict, built column
    by column (json_columns.py); a batch holding a non-finite float (which orjson would turn
    into null) goes through the standard library's encoder, which writes NaN, Infinity and
    -Infinity as JavaScript and Python's json module read them: no value is lost."""
    from .json_columns import json_objects  # orjson: the kafka extra, not the configuration's

    selected = batch.select(columns)
    arrays = [_iso_strings(column) for column in selected.columns]
    if any(_has_non_finite(column) for column in arrays):
        rows = pa.RecordBatch.from_arrays(arrays, names=list(columns)).to_pylist()
        encode = json.JSONEncoder(default=_json_default, separators=(",", ":")).encode
        return pa.array([encode(row).encode() for row in rows], pa.binary())
    return json_objects(arrays, columns, _json_default).cast(pa.binary())


def _has_non_finite(array: pa.Array) -> bool:
    if not pa.types.is_floating(array.type) or array.null_count == len(array):
        return False
    return not pc.all(pc.is_finite(array.drop_null())).as_py()


_UTC_NAMES = frozenset({"UTC", "Etc/UTC", "+00:00", "Z", "utc"})


def _iso_strings(array: pa.Array) -> pa.Array:
    """Timestamps (naive or UTC) and dates as ISO 8601 strings, computed in Arrow (a Python
    datetime per value costs ~10 us); any other array unchanged."""
    kind = array.type
    if pa.types.is_date(kind):
        return array.cast(pa.string())
    if not pa.types.is_timestamp(kind) or (kind.tz is not None and kind.tz not in _UTC_NAMES):
        return array  # other time zones: Python's isoformat, through _json_default
    text = array.cast(pa.timestamp(kind.unit)).cast(pa.string())  # UTC wall time
    text = pc.replace_substring(text, " ", "T", max_replacements=1)
    if kind.tz is not None:
        text = pc.binary_join_element_wise(text, "+00:00", "")
    return text


def _json_default(value: object) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
