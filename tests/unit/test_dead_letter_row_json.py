"""A dead letter's row_json holds the whole refused row, even values Python's datetime cannot
hold (a timestamp or date before year 1, which targets refuse as out of range)."""

from __future__ import annotations

import json

import pyarrow as pa

from durable_sinks.coordinator._dead_letters import DeadLetterPass
from durable_sinks.core.bad_rows import BadRowCap, Refusal, RefusalReason, RefusedRows

ANCIENT_US = -300_000_000_000_000_000  # about 7537 BC


def test_an_out_of_range_timestamp_becomes_iso_text_in_its_dead_letter() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "id": [1, 2, 3],
            "ts": pa.array([ANCIENT_US, 0, None], pa.timestamp("us", tz="UTC")),
            "day": pa.array([-3_000_000, 0, 1], pa.date32()),
        }
    )
    letters = DeadLetterPass("job", 4, BadRowCap(1.0), isolating=True)
    letters.read(0, batch)
    refusal = Refusal(RefusalReason.TIMESTAMP_OUT_OF_RANGE, "out of range", "ts")
    letters.add("postgres", 0, batch, RefusedRows.of([(0, refusal), (1, refusal)]))
    written = letters.batch()
    assert written is not None
    rows = [json.loads(text) for text in written.column("row_json").to_pylist()]
    assert rows == [
        {"id": 1, "ts": "-7537-05-18T18:40:00.000000+00:00", "day": "-6244-04-12"},
        {"id": 2, "ts": "1970-01-01T00:00:00.000000+00:00", "day": "1970-01-01"},
    ]
    assert written.column("row_number").to_pylist() == [0, 1]
