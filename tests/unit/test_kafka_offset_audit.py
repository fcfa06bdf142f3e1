"""How the Kafka audit attributes the records counted in an epoch's offset ranges (without
the epoch header): exactly when a range holds only the epoch's offsets, from the markers when
another writer shares it within what the shared offsets can hold, a problem otherwise."""

from __future__ import annotations

from durable_sinks.sinks.kafka.operations import _attributed
from durable_sinks.sinks.kafka.progress import ProgressRecord


def marker(
    rows: int, ranges: dict[int, tuple[int, int]] | None, participant: str = "p1"
) -> ProgressRecord:
    """A progress record of epoch 4 whose ranges are in topic `events`."""
    spans = None if ranges is None else {"events": ranges}
    return ProgressRecord(4, 1, participant, rows, "crc32:0", None, spans)


def test_a_range_of_the_epochs_own_offsets_is_counted_exactly() -> None:
    own = [marker(10, {0: (5, 11), 1: (0, 4)})]
    assert _attributed(4, own, {4: 10}) == (10, True, ())
    assert _attributed(4, own, {4: 9}) == (9, True, ())  # verify: 9 held, 10 decided


def test_another_writers_offsets_in_the_range_leave_the_rows_to_the_markers() -> None:
    shared = [marker(10, {0: (5, 13), 1: (0, 4)})]  # 12 offsets: 2 are not the epoch's
    assert _attributed(4, shared, {4: 10}) == (10, True, ())
    assert _attributed(4, shared, {4: 12}) == (10, False, ())
    rows, counted, problems = _attributed(4, shared, {4: 13})
    assert (rows, counted) == (13, True)
    assert "13 committed records for 10 rows" in problems[0]


def test_an_epoch_committed_twice_counts_both_ranges() -> None:
    twice = [marker(10, {0: (0, 10)}), marker(10, {0: (12, 22)}, "p2")]
    assert _attributed(4, twice, {4: 20}) == (20, True, ())  # verify: 20 held, 10 decided


def test_progress_records_without_ranges_give_the_markers_rows() -> None:
    assert _attributed(4, [marker(10, None)], {}) == (10, False, ())
    assert _attributed(4, [], {4: 3}) == (None, False, ())


def test_ranges_survive_the_progress_records_encoding() -> None:
    record = marker(10, {1: (7, 9), 0: (3, 11)})
    decoded = ProgressRecord.decode(record.encode(), "t@0")
    assert decoded == record
    assert decoded.span() == 10
