"""The default record value (a JSON object of the row's columns) built column by column.

Byte for byte what `orjson.dumps({column: value, ...})` writes for each row (the path it
replaced; tests/unit/test_kafka_records.py compares the two), at a fraction of its cost: no
dict and no orjson call per row. Each column becomes the JSON text of its values as one Arrow string
array, and Arrow joins the columns into objects:
- integers and booleans: Arrow's cast to text (the digits, `true`/`false`);
- floats: one `orjson.dumps` of the whole column as a list, cut at the commas (a float's
  JSON never holds one) into an Arrow string array by offsets computed in numpy (no Python
  object per value), so every value is written by orjson itself;
- strings: written as they are when no value needs escaping (no `"`, `\\` or control
  character: one scan of the column's bytes), their quotes joined into the text around them
  (no array of quoted copies), else each value by orjson;
- anything else (timestamps in other zones, decimals, binary, nested types): each value by
  orjson with the same `default` as the reference path.
A null is `null` in every column. Non-finite floats are not handled here (the caller sends
such batches through the standard library's encoder, which keeps them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc


def json_objects(
    arrays: Sequence[pa.Array], names: Sequence[str], default: Callable[[Any], Any]
) -> pa.Array:
    """One compact JSON object per row (a string array without nulls): `names[i]` holds
    `arrays[i]`'s value, in that order. Timestamps and dates should already be ISO strings."""
    parts: list[Any] = []
    closing = ""  # text owed to the previous column (its closing quote)
    for n, (name, array) in enumerate(zip(names, arrays, strict=True)):
        text, bare = _json_text(array, default)
        opening = '"' if bare else ""
        parts.append(
            closing + ("{" if n == 0 else ",") + orjson.dumps(name).decode() + ":" + opening
        )
        parts.append(text)
        closing = opening
    parts.append(closing + "}")
    joined: pa.Array = pc.binary_join_element_wise(*parts, "")
    return joined


def _json_text(array: pa.Array, default: Callable[[Any], Any]) -> tuple[pa.Array, bool]:
    """The JSON text of each value of `array` (null: `null`), and whether it still needs
    its quotes around it (a string column written as it is)."""
    kind = array.type
    if len(array) == 0:
        return pa.array([], pa.string()), False
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        text = array.cast(pa.string())
    elif pa.types.is_floating(kind):
        return _float_text(array), False
    elif (pa.types.is_string(kind) or pa.types.is_large_string(kind)) and not _needs_escape(array):
        if array.null_count == 0:
            return array.cast(pa.string()), True
        text = pc.binary_join_element_wise('"', array.cast(pa.string()), '"', "")
    else:
        dumps = orjson.dumps
        values = [dumps(v, default=default) for v in array.to_pylist()]
        return pa.array(values, pa.binary()).cast(pa.string()), False
    filled: pa.Array = pc.fill_null(text, "null")
    return filled, False


def _float_text(array: pa.Array) -> pa.Array:
    """orjson's text of each float of a non-empty array (null: `null`), as a string array:
    the column dumped as one JSON list, its commas dropped and their places made the
    values' offsets (a column whose text outgrows 32-bit offsets is split into a list)."""
    values = array.to_numpy().tolist() if array.null_count == 0 else array.to_pylist()
    dumped = orjson.dumps(values)  # "[v,v,...]", null for None
    body = np.frombuffer(dumped, dtype=np.uint8)[1:-1]
    commas = np.flatnonzero(body == 0x2C)
    data = np.delete(body, commas)
    if len(data) > np.iinfo(np.int32).max:
        return pa.array(dumped[1:-1].split(b","), pa.binary()).cast(pa.string())
    offsets = np.empty(len(array) + 1, dtype=np.int32)
    offsets[0], offsets[-1] = 0, len(data)
    offsets[1:-1] = commas - np.arange(len(commas))
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), len(array), buffers)


def _needs_escape(array: pa.Array) -> bool:
    """Whether any value of a string array holds a byte JSON escapes (one pass over the
    bytes the array's values occupy; null values occupy none)."""
    offsets, data = array.buffers()[1], array.buffers()[2]
    if offsets is None or data is None:
        return False
    wide = pa.types.is_large_string(array.type)
    ends = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)
    start, end = int(ends[array.offset]), int(ends[array.offset + len(array)])
    used = np.frombuffer(data, dtype=np.uint8)[start:end]
    # JSON escapes control characters, `"` and `\\` (no byte of a multi-byte character is
    # below 0x80).
    return bool(((used < 0x20) | (used == 0x22) | (used == 0x5C)).any())
