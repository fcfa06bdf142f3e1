"""The default record value (a JSON object of the row's columns) built column by column.

Byte for byte what `orjson.dumps({column: value, ...})` writes for each row (the path it
replaced; tests/unit/test_kafka_records.py compares the two), at a fraction of its cost: no
dict and no orjson call per row. Each column becomes the JSON text of its values as one Arrow string
array, and Arrow joins the columns into objects:
- integers and booleans: Arrow's cast to text (the digits, `true`/`false`);
- floats: one `orjson.dumps` of the whole column as a list, split at the commas (a float's
  JSON never holds one), so every value is written by orjson itself;
- strings: quoted in Arrow when no value needs escaping (no `"`, `\\` or control character),
  else each value by orjson;
- anything else (timestamps in other zones, decimals, binary, nested types): each value by
  orjson with the same `default` as the reference path.
A null is `null` in every column. Non-finite floats are not handled here (the caller sends
such batches through the standard library's encoder, which keeps them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

#: A character JSON requires escaped (RE2 syntax, as Arrow's regex kernels take it).
_NEEDS_ESCAPE = '["\\\\\x00-\x1f]'


def json_objects(
    arrays: Sequence[pa.Array], names: Sequence[str], default: Callable[[Any], Any]
) -> pa.Array:
    """One compact JSON object per row (a string array without nulls): `names[i]` holds
    `arrays[i]`'s value, in that order. Timestamps and dates should already be ISO strings."""
    parts: list[Any] = []
    for n, (name, array) in enumerate(zip(names, arrays, strict=True)):
        parts.append(("{" if n == 0 else ",") + orjson.dumps(name).decode() + ":")
        parts.append(_json_text(array, default))
    parts.append("}")
    joined: pa.Array = pc.binary_join_element_wise(*parts, "")
    return joined


def _json_text(array: pa.Array, default: Callable[[Any], Any]) -> pa.Array:
    """The JSON text of each value of `array` (null: `null`)."""
    kind = array.type
    if len(array) == 0:
        return pa.array([], pa.string())
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        text = array.cast(pa.string())
    elif pa.types.is_floating(kind):
        dumped = orjson.dumps(array.to_pylist())  # "[v,v,...]", null for None
        return pa.array(dumped[1:-1].split(b","), pa.binary()).cast(pa.string())
    elif (pa.types.is_string(kind) or pa.types.is_large_string(kind)) and not pc.any(
        pc.match_substring_regex(array, _NEEDS_ESCAPE)
    ).as_py():
        text = pc.binary_join_element_wise('"', array.cast(pa.string()), '"', "")
    else:
        dumps = orjson.dumps
        return pa.array([dumps(v, default=default) for v in array.to_pylist()], pa.binary()).cast(
            pa.string()
        )
    filled: pa.Array = pc.fill_null(text, "null")
    return filled
