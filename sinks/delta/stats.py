"""Per-file column statistics for a Delta `add` action (`numRecords`, `minValues`,
`maxValues`, `nullCount`), so readers can skip files.

Min/max are kept only where they are exact in Delta's JSON form: integers, dates and strings of
at most 32 characters (Delta readers treat longer string stats as truncated prefixes; a cut
max would let a reader skip a file that holds the row). Null counts for every top-level
column of a primitive type.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

MAX_STRING_STAT = 32


class FileStats:
    """Statistics of one data file, fed batch by batch."""

    def __init__(self) -> None:
        self.rows = 0
        self.nulls: dict[str, int] = {}
        self.minimum: dict[str, Any] = {}
        self.maximum: dict[str, Any] = {}
        self._dropped: set[str] = set()

    def add(self, batch: pa.RecordBatch) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        self.rows += batch.num_rows
        for field, column in zip(batch.schema, batch.columns, strict=True):
            kind = field.type
            if pa.types.is_nested(kind) or pa.types.is_dictionary(kind):
                continue
            self.nulls[field.name] = self.nulls.get(field.name, 0) + column.null_count
            if field.name in self._dropped or not _ranged(kind):
                continue
            if column.null_count == len(column):
                continue
            bounds = pc.min_max(column).as_py()
            low, high = _json_value(bounds["min"]), _json_value(bounds["max"])
            if low is None or high is None:
                self._dropped.add(field.name)
                self.minimum.pop(field.name, None)
                self.maximum.pop(field.name, None)
                continue
            if field.name not in self.minimum or low < self.minimum[field.name]:
                self.minimum[field.name] = low
            if field.name not in self.maximum or high > self.maximum[field.name]:
                self.maximum[field.name] = high

    def to_json(self) -> str:
        return json.dumps(
            {
                "numRecords": self.rows,
                "minValues": self.minimum,
                "maxValues": self.maximum,
                "nullCount": self.nulls,
            },
            separators=(",", ":"),
            sort_keys=True,
        )


def _ranged(kind: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_integer(kind)
        or pa.types.is_date32(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
    )


def _json_value(value: Any) -> Any:
    """The stat in Delta's JSON form, or None when it cannot be kept exactly."""
    import datetime

    if isinstance(value, str):
        return value if len(value) <= MAX_STRING_STAT else None
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None
