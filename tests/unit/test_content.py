"""The content summary (core/content.py): the same rows give the same digest whatever their
order, batching, slicing and string layout; any changed, missing, extra or moved value gives
another; nulls, types and names count."""

from __future__ import annotations

import datetime
import decimal
import random
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_sinks.core import content
from durable_sinks.core.content import ALGORITHM, ContentSummary, ContentTally, summarise

UTC = datetime.timezone.utc


def events(n: int = 500, seed: int = 1) -> pa.Table:
    rng = random.Random(seed)

    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.15 else value

    start = datetime.datetime(2026, 1, 1, tzinfo=UTC)
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "body": [maybe("x" * rng.randrange(0, 40) + str(i)) for i in range(n)],
            "score": [maybe(rng.random()) for _ in range(n)],
            "at": pa.array(
                [maybe(start + datetime.timedelta(seconds=i)) for i in range(n)],
                pa.timestamp("us", tz="UTC"),
            ),
            "qty": pa.array([maybe(rng.randrange(-5, 5)) for _ in range(n)], pa.int32()),
            "ok": [maybe(rng.random() < 0.5) for _ in range(n)],
        }
    )


def digest(table: pa.Table, chunk: int | None = None) -> ContentSummary:
    return summarise(table.to_batches(max_chunksize=chunk))


def with_value(table: pa.Table, column: str, row: int, value: Any) -> pa.Table:
    values = table.column(column).to_pylist()
    values[row] = value
    index = table.schema.get_field_index(column)
    return table.set_column(index, table.field(column), pa.array(values, table.field(column).type))


def test_the_order_of_rows_and_batches_does_not_matter() -> None:
    table = events()
    order = list(range(table.num_rows))
    random.Random(3).shuffle(order)
    shuffled = table.take(order)
    first = digest(table, 64)
    assert first.rows == table.num_rows
    assert first.digest is not None
    assert first.algorithm == ALGORITHM
    assert digest(shuffled, 77) == first
    assert digest(shuffled) == first  # one batch
    # partitions read in another order, each as its own slices
    halves = [shuffled.slice(0, 200), shuffled.slice(200)]
    assert summarise([*halves[1].to_batches(30), *halves[0].to_batches(11)]) == first


@pytest.mark.parametrize(
    ("column", "row", "value"),
    [
        ("id", 7, 10_007),
        ("body", 3, "changed"),
        ("body", 4, ""),
        ("score", 5, 0.5),
        ("at", 6, datetime.datetime(1999, 1, 1, tzinfo=UTC)),
        ("qty", 8, 99),
        ("ok", 9, None),
    ],
)
def test_one_changed_value_changes_the_digest(column: str, row: int, value: Any) -> None:
    table = events()
    changed = with_value(table, column, row, value)
    assert changed.column(column)[row] != table.column(column)[row]  # (really a change)
    assert digest(changed).differs_from(digest(table))
    assert digest(changed).rows == table.num_rows


def test_values_moved_between_rows_change_the_digest() -> None:
    """The digest is of rows, not of each column's values: a column's values swapped
    between two rows is another set of rows."""
    table = pa.table({"id": [1, 2], "body": ["a", "b"]})
    swapped = pa.table({"id": [1, 2], "body": ["b", "a"]})
    assert digest(table) != digest(swapped)
    assert digest(table).rows == digest(swapped).rows


def test_rows_count_as_often_as_they_come() -> None:
    once = pa.table({"id": [1, 2]})
    twice = pa.table({"id": [1, 1, 2, 2]})
    other = pa.table({"id": [1, 1]})
    assert digest(once).rows == 2
    assert digest(twice).rows == 4
    assert digest(pa.table({"id": [1, 2, 2]})) != digest(pa.table({"id": [1, 1, 2]}))
    assert digest(other).digest != digest(pa.table({"id": [2, 2]})).digest


def test_nulls_differ_from_every_value_and_from_each_other_column() -> None:
    strings = [digest(pa.table({"s": pa.array(v, pa.string())})) for v in ([None], [""], ["0"])]
    assert len({s.digest for s in strings}) == 3
    numbers = [digest(pa.table({"n": pa.array(v, pa.int64())})) for v in ([None], [0], [1])]
    assert len({s.digest for s in numbers}) == 3
    two = pa.table({"a": pa.array([None, 1], pa.int64()), "b": pa.array([1, None], pa.int64())})
    swapped = pa.table({"a": pa.array([1, None], pa.int64()), "b": pa.array([None, 1], pa.int64())})
    assert digest(two) == digest(swapped)  # (the same two rows)
    crossed = pa.table({"a": pa.array([None, 1], pa.int64()), "b": pa.array([None, 1], pa.int64())})
    assert digest(two) != digest(crossed)


def test_the_bytes_a_null_hides_are_not_read() -> None:
    """Arrow lets a null string keep bytes behind it (here longer than any value, with a long
    value beside it: both paths of _binary_words); they are not part of the row."""
    long = "abc" * 100
    clean = pa.array([long, None, "d"], pa.string())
    data = long.encode() + b"x" * 3000 + b"d"
    bounds = pa.array([0, 300, 3300, 3301], pa.int32()).buffers()[1]
    hiding = pa.Array.from_buffers(
        pa.string(), 3, [clean.buffers()[0], bounds, pa.py_buffer(data)], null_count=1
    )
    assert hiding.to_pylist() == clean.to_pylist()
    assert digest(pa.table({"s": hiding})) == digest(pa.table({"s": clean}))


def test_floats_compare_as_values() -> None:
    def of(values: list[float]) -> ContentSummary:
        return digest(pa.table({"f": pa.array(values, pa.float64())}))

    assert of([0.0]) == of([-0.0])
    nan_bits = pa.array([float("nan")], pa.float64())
    other_nan = pa.Array.from_buffers(
        pa.float64(), 1, [None, pa.py_buffer(bytes.fromhex("010000000000f87f"))]
    )
    assert digest(pa.table({"f": nan_bits})) == digest(pa.table({"f": other_nan}))
    assert of([1.0]) != of([1.0000000000000002])


def test_names_and_types_count_but_not_the_string_layout() -> None:
    table = events(100)
    renamed = table.rename_columns(["id", "text", "score", "at", "qty", "ok"])
    assert digest(renamed) != digest(table)
    narrow = table.set_column(0, "id", table.column("id").cast(pa.int32()))
    assert digest(narrow) != digest(table)
    for layout in (pa.large_string(), pa.string_view()):
        other = table.set_column(1, pa.field("body", layout), table.column("body").cast(layout))
        assert digest(other) == digest(table), layout


def test_a_values_hash_does_not_depend_on_its_batch() -> None:
    """Long values are hashed by a second path; the same value in a batch of short ones, of
    long ones, or alone hashes the same."""
    values = ["", "a", "12345678", "123456789", "y" * 127, "z" * 128, "w" * 129, "v" * 5000, None]
    batch = pa.record_batch({"s": values})
    seed = 12345
    together = content.row_hashes(batch, seed).tolist()
    alone = [content.row_hashes(batch.slice(i, 1), seed).tolist()[0] for i in range(len(values))]
    assert together == alone
    assert len(set(together)) == len(values)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=300)), min_size=1, max_size=40))
def test_binary_words_are_the_documented_weighted_sum(values: list[bytes | None]) -> None:
    """_binary_words against a plain Python reading of its docstring."""
    column = pa.array(values, pa.binary())
    got = content._binary_words(column).tolist()
    mask = (1 << 64) - 1
    for value, word in zip(values, got, strict=True):
        if value is None:
            continue  # (anything: the caller replaces nulls)
        weights = content._weights(len(value) // 8 + 1).tolist()
        expected = len(value) * content._LENGTH
        for k in range(0, len(value), 8):
            chunk = int.from_bytes(value[k : k + 8].ljust(8, b"\0"), "little")
            expected += chunk * weights[k // 8]
        assert word == expected & mask


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
            st.text(st.characters(codec="utf-8"), max_size=20),
        ),
        max_size=60,
    ),
    st.randoms(use_true_random=False),
    st.integers(1, 17),
)
def test_any_shuffle_and_batching_gives_the_same_summary(
    rows: list[tuple[int | None, str]], rng: random.Random, chunk: int
) -> None:
    schema = pa.schema([("n", pa.int64()), ("s", pa.string())])
    table = pa.Table.from_pylist([{"n": n, "s": s} for n, s in rows], schema)
    shuffled = rows[:]
    rng.shuffle(shuffled)
    other = pa.Table.from_pylist([{"n": n, "s": s} for n, s in shuffled], schema)
    assert summarise(other.to_batches(max_chunksize=chunk)) == summarise(table.to_batches())


def test_nested_and_other_types() -> None:
    def hashes(array: pa.Array) -> list[int]:
        batch = pa.record_batch({"c": array})
        result: list[int] = content.row_hashes(batch, 7).tolist()
        return result

    lists = hashes(pa.array([[1, 2], [2, 1], None, [], [None]]))
    assert len(set(lists)) == 5  # a list's order counts
    maps = hashes(
        pa.array(
            [[("a", 1), ("b", 2)], [("b", 2), ("a", 1)], [("a", 2), ("b", 1)], None],
            pa.map_(pa.string(), pa.int64()),
        )
    )
    assert maps[0] == maps[1]  # a map's entries in any order
    assert len({maps[0], maps[2], maps[3]}) == 3
    structs = hashes(pa.array([{"x": 1, "y": "a"}, {"x": 1, "y": None}, None, {"x": 1, "y": "a"}]))
    assert structs[0] == structs[3]
    assert len(set(structs[:3])) == 3
    misc = {
        "decimal": pa.array(
            [decimal.Decimal("1.50"), decimal.Decimal("-1.50")], pa.decimal128(9, 2)
        ),
        "date": pa.array([datetime.date(2020, 1, 1), datetime.date(2020, 1, 2)]),
        "fixed": pa.array([b"abcd", b"abce"], pa.binary(4)),
        "dict": pa.array(["x", "y"]).dictionary_encode(),
        "f32": pa.array([1.5, 2.5], pa.float32()),
        "bool": pa.array([True, False]),
        "null": pa.array([None, None], pa.null()),
    }
    for name, array in misc.items():
        h = hashes(array)
        assert (h[0] != h[1]) == (name != "null"), name
        assert hashes(array.slice(1)) == h[1:], name  # offsets respected
    assert hashes(pa.array(["x", "y"]).dictionary_encode()) == hashes(pa.array(["x", "y"]))


def test_count_only_tally_and_the_summary_json() -> None:
    tally = ContentTally(digest=False)
    for batch in tally.through(events(50).to_batches(max_chunksize=20)):
        assert isinstance(batch, pa.RecordBatch)
    counted = tally.summary()
    assert counted == ContentSummary(50, None)
    assert ContentSummary.from_json(counted.to_json()) == counted
    full = digest(events(50))
    assert ContentSummary.from_json(full.to_json()) == full
    assert "digest" not in counted.to_json()
    # counts always compare; digests only when both have one of the same algorithm
    assert not counted.differs_from(full)
    assert ContentSummary(49, None).differs_from(full)
    assert not ContentSummary(50, "0" * 16, "another-1").differs_from(full)
    assert ContentSummary(50, "0" * 16).differs_from(full)
    for bad in ({}, {"rows": -1, "algorithm": "x"}, {"rows": "3", "algorithm": "x"}, [1]):
        with pytest.raises((KeyError, TypeError, ValueError)):
            ContentSummary.from_json(bad)  # type: ignore[arg-type]


def test_batches_passed_through_are_hashed_aside_to_the_same_summary() -> None:
    """`through` hashes on a thread of its own; the summary waits for it and equals the one
    of `add`, and a tally can go on after a summary."""
    table = events(500)
    tally = ContentTally()
    passed = list(tally.through(table.to_batches(max_chunksize=64)))
    assert pa.Table.from_batches(passed).equals(table)
    assert tally.summary() == summarise(table.to_batches(max_chunksize=100))
    more = events(50, seed=2)
    list(tally.through(more.to_batches()))
    both = summarise([*table.to_batches(), *more.to_batches()])
    assert tally.summary() == both


def test_the_hashing_falls_behind_by_a_bounded_number_of_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the bound below one batch, every batch is hashed before the next is given."""
    monkeypatch.setattr(content, "HASH_AHEAD_BYTES", 0)
    table = events(200)
    tally = ContentTally()
    for batch in tally.through(table.to_batches(max_chunksize=50)):
        assert isinstance(batch, pa.RecordBatch)
        assert not tally._pending  # the bound is what is tested
    assert tally.summary() == summarise(table.to_batches())
