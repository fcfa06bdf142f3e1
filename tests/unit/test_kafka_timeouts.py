"""The Kafka sink's derived transaction timeout (sinks/kafka/timeouts.py): pure logic, no
client."""

from __future__ import annotations

import pytest

from durable_sinks.sinks.kafka.progress import ProgressRecord
from durable_sinks.sinks.kafka.timeouts import (
    FLOOR_S,
    HEADROOM,
    KAFKA_MAX_S,
    WINDOW,
    TransactionTimeout,
    derived,
    floor_of,
    rung,
    shared,
)


def test_the_ladder_doubles_from_kafkas_default_up_to_the_ceiling() -> None:
    assert [rung(s, 900.0) for s in (0, 1, 60, 61, 120, 121, 400, 481, 5000)] == [
        60.0, 60.0, 60.0, 120.0, 120.0, 240.0, 480.0, 900.0, 900.0,
    ]  # fmt: skip
    # a broker that allows an hour: the ladder goes on doubling
    assert rung(1000.0, 3600.0) == 1920.0
    assert rung(3000.0, 3600.0) == 3600.0


def test_a_low_ceiling_keeps_room_to_grow_and_librdkafkas_minimum() -> None:
    assert floor_of(KAFKA_MAX_S) == FLOOR_S
    assert floor_of(8.0) == 1.0
    assert floor_of(4.0) == 1.0  # librdkafka refuses transaction.timeout.ms under 1 s
    assert [rung(s, 8.0) for s in (0.1, 1.5, 3.0, 7.0, 9.0)] == [1.0, 2.0, 4.0, 8.0, 8.0]


def test_the_timeout_is_headroom_times_the_longest_open_time() -> None:
    assert derived(10.0, 900.0) == 60.0
    assert derived(20.0, 900.0) == 120.0  # 80 s needed
    assert derived(100.0, 900.0) == 480.0  # 400 s needed
    assert derived(300.0, 900.0) == 900.0  # 1,200 s needed: the ceiling is all there is
    assert derived(100.0, 900.0) >= HEADROOM * 100.0


def test_a_job_with_nothing_measured_starts_at_the_ceiling_then_takes_its_measure() -> None:
    """The first epoch of a new job may be its largest (a backlog): it gets the ceiling.
    The first committed epoch's open time brings the timeout down at once."""
    chooser = TransactionTimeout()
    assert chooser.bounded(900.0, stored_open_s=None) == 900.0
    assert chooser.committed(2.0) == 60.0
    assert chooser.current_s == 60.0
    assert chooser.committed(3.0) is None  # same rung: the producer stays


def test_a_first_epoch_that_needs_the_ceiling_keeps_it() -> None:
    chooser = TransactionTimeout()
    chooser.bounded(900.0, stored_open_s=None)
    assert chooser.committed(500.0) is None
    assert chooser.current_s == 900.0


def test_a_restarted_job_starts_from_what_its_progress_record_carries() -> None:
    chooser = TransactionTimeout()
    assert chooser.bounded(900.0, stored_open_s=100.0) == 480.0
    assert chooser.longest_recent_s == 100.0


def test_it_grows_at_once_and_shrinks_only_after_a_window_that_fits_a_lower_rung() -> None:
    chooser = TransactionTimeout()
    chooser.bounded(900.0, stored_open_s=5.0)
    assert chooser.current_s == 60.0
    assert chooser.committed(40.0) == 240.0  # 160 s needed: grows before the next epoch
    changes = [chooser.committed(1.0) for _ in range(WINDOW - 1)]
    # the 40 s epoch is still among the last WINDOW: no change
    assert changes == [None] * (WINDOW - 1)
    assert chooser.committed(1.0) == 60.0  # it left the window after WINDOW epochs at 240 s
    assert chooser.epochs_at_current == 0


def test_no_change_of_producer_for_epochs_that_vary_within_a_rung() -> None:
    chooser = TransactionTimeout()
    chooser.bounded(900.0, stored_open_s=10.0)
    changes = [chooser.committed(s) for s in [1.0, 14.0, 3.0, 9.0, 15.0] * 20]
    assert changes == [None] * 100


def test_a_broker_timeout_takes_the_ceiling_next_then_gives_up() -> None:
    """Never the same timeout twice: the attempt after an abort takes the ceiling; an abort
    at the ceiling has no longer timeout left (None: the sink raises ConfigError)."""
    chooser = TransactionTimeout()
    chooser.bounded(900.0, stored_open_s=5.0)
    assert chooser.timed_out(61.0) == 900.0
    assert chooser.current_s == 900.0
    assert chooser.timed_out(901.0) is None
    assert chooser.current_s == 900.0


def test_a_batch_that_commits_after_the_abort_keeps_a_timeout_that_covers_it() -> None:
    chooser = TransactionTimeout()
    chooser.bounded(900.0, stored_open_s=5.0)
    chooser.timed_out(61.0)
    assert chooser.committed(200.0) is None  # 800 s needed: the ceiling stays
    assert chooser.current_s == 900.0


def test_a_given_timeout_is_used_as_is() -> None:
    chooser = TransactionTimeout(explicit_s=90.0)
    assert chooser.bounded(900.0, stored_open_s=200.0) == 90.0
    assert chooser.committed(80.0) is None
    assert chooser.timed_out(91.0) is None
    assert chooser.current_s == 90.0


def test_a_lower_ceiling_at_a_later_open_bounds_the_learnt_timeout() -> None:
    chooser = TransactionTimeout()
    chooser.bounded(900.0, stored_open_s=None)
    assert chooser.bounded(300.0, stored_open_s=None) == 300.0


def test_one_chooser_per_transactional_id_and_process() -> None:
    first = shared("b:9092", "ds:job-timeouts:kafka", None)
    first.bounded(900.0, stored_open_s=None)
    first.committed(2.0)
    again = shared("b:9092", "ds:job-timeouts:kafka", None)
    assert again is first  # a ride-out's new sink continues
    assert again.current_s == 60.0
    assert shared("b:9092", "ds:job-timeouts:kafka", 90.0) is not first  # the setting changed
    assert shared("b:9092", "ds:other:kafka", None) is not first


@pytest.mark.parametrize("value", [None, 12.5])
def test_the_progress_record_carries_the_open_times(value: float | None) -> None:
    record = ProgressRecord(3, 1, "p", 10, "crc32:0", None, {"t": {0: (0, 10)}}, value, value)
    decoded = ProgressRecord.decode(record.encode(), "t@0")
    assert decoded == record
    assert (b"open_s" in record.encode()) is (value is not None)


@pytest.mark.parametrize("bad", ["-1", "1e400", '"x"', "[]"])
def test_an_unreadable_open_time_is_a_corrupt_record(bad: str) -> None:
    from durable_sinks.core.errors import ManifestCorruptError

    value = ProgressRecord(3, 1, "p", 10, "crc32:0", None).encode()
    broken = value[:-1] + b',"open_s":' + bad.encode() + b"}"
    with pytest.raises(ManifestCorruptError):
        ProgressRecord.decode(broken, "t@0")
