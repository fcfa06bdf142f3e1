"""Dead letters of dates and timestamps Python's datetime cannot hold (before year 1, after
9999): the very values a target refuses keep their value in row_json, as ISO 8601 with an
expanded year, instead of failing the epoch."""

from __future__ import annotations

import json

import pyarrow as pa

from durable_sinks.coordinator._dead_letters import DeadLetterPass
from durable_sinks.core.bad_rows import BadRowCap, Refusal, RefusalReason, RefusedRows

OUT = Refusal(RefusalReason.TIMESTAMP_OUT_OF_RANGE, "timestamp out of range", "at")


def test_dates_and_timestamps_past_pythons_range_are_iso_8601_with_expanded_years() -> None:
    batch = pa.record_batch(
        {
            "at": pa.array([-(2**62), 0, None], pa.timestamp("us", "UTC")),
            "ms": pa.array([2**62, 1, 2], pa.timestamp("ms")),
            "day": pa.array([2_145_042_905, -2_440_588, 0], pa.date32()),
            "n": [1, 2, 3],
        }
    )
    letters = DeadLetterPass("job", 4, BadRowCap(10), isolating=True)
    letters.read(0, batch)
    letters.add("postgres", 0, batch, RefusedRows((0, 1, 2), (OUT, OUT, OUT)))
    dead = letters.batch()
    assert dead is not None
    rows = [json.loads(text) for text in dead.column("row_json").to_pylist()]
    assert rows == [
        {
            "at": "-144169-06-28T09:59:32.612096+00:00",
            "ms": "+146140482-04-24T15:36:27.904",
            "day": "+5874897-12-31",
            "n": 1,
        },
        {
            "at": "1970-01-01T00:00:00.000000+00:00",
            "ms": "1970-01-01T00:00:00.001",
            "day": "-4713-11-24",
            "n": 2,
        },
        {"at": None, "ms": "1970-01-01T00:00:00.002", "day": "1970-01-01", "n": 3},
    ]
