"""What the conformance suite writes and where it may crash: the scenario of one example
(targets and decision store), the generated epochs, and the crash points."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from hypothesis import strategies as st

from durable_sinks.coordinator import Coordinator
from durable_sinks.core import SinkConnector
from durable_sinks.core.bad_rows import RefusalReason, dead_letter_schema
from durable_sinks.manifest import DecisionStore

Row = tuple[Any, ...]

SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("n", pa.int64()),
        pa.field("text", pa.string()),
        pa.field("x", pa.float64()),
        pa.field("flag", pa.bool_()),
    ]
)
COLUMNS = tuple(SCHEMA.names)
#: The columns of a dead letter (core/bad_rows.dead_letter_schema), in order: what the
#: dead-letter target's `committed_rows()` gives.
DEAD_LETTER_COLUMNS = tuple(dead_letter_schema().names)

EXAMPLES_ENV = "DS_CONFORMANCE_EXAMPLES"


class Target(Protocol):
    """One sink's target (a folder, a table, a topic), fresh for each example."""

    name: str

    def connector(self) -> SinkConnector:
        """A new connector to the target, sharing nothing in memory with earlier ones."""
        ...

    def committed_rows(self) -> list[Row]:
        """Every row the target's readers can see, as tuples in COLUMNS order."""
        ...

    def leftovers(self) -> list[str]:
        """Participants prepared or half-written on the target (should be none when settled)."""
        ...


@dataclass(frozen=True)
class BadRows:
    """How to make rows a target refuses (a null in a NOT NULL column, a value a CHECK
    constraint rejects, ...): give it to the target as its `bad_rows` attribute, and the
    scenario a dead-letter target.

    - `refusal(row)`: whether the target refuses `row` (key first, in COLUMNS order) and
      why: the reason its dead letter must carry, or None when it takes the row. It is asked
      about every row of every epoch, generated good rows included, so it must be exact;
    - `examples`: values (COLUMNS without the key) of rows it refuses, put into the scripted
      sweep's epochs (at least one);
    - `values`: a strategy of such values, mixed into the generated batches (default: the
      examples).
    """

    refusal: Callable[[Row], RefusalReason | None]
    examples: tuple[tuple[Any, ...], ...]
    values: st.SearchStrategy[tuple[Any, ...]] | None = None

    def __post_init__(self) -> None:
        if not self.examples:
            raise ValueError("BadRows needs at least one example of a row the target refuses")

    @property
    def strategy(self) -> st.SearchStrategy[tuple[Any, ...]]:
        return self.values if self.values is not None else st.sampled_from(self.examples)


def bad_rows_of(target: Target) -> BadRows | None:
    """The target's `bad_rows` (None: it takes every row)."""
    bad = getattr(target, "bad_rows", None)
    if bad is not None and not isinstance(bad, BadRows):
        raise TypeError(f"target {target.name}: bad_rows must be a BadRows, not {bad!r}")
    return bad


@dataclass
class Scenario:
    """What one example runs against: the targets of one job and its decision store.

    With `dead_letter` (a Target whose `committed_rows()` gives dead letters as tuples in
    DEAD_LETTER_COLUMNS order) the job runs with `on_bad_rows="dead_letter"` and no cap on
    bad rows: the targets that have `bad_rows` refuse rows, and every row of every epoch must
    end in exactly one of its target or the dead letter, with its reason."""

    job_id: str
    targets: Sequence[Target]
    store: Callable[[], DecisionStore]
    cleanup: Callable[[], None] = lambda: None
    #: Builds the coordinator from (job_id, sinks, store), e.g. a `functools.partial` of
    #: Coordinator with options, or a subclass. With a dead letter it also gets `policy`,
    #: `dead_letter` and `bad_row_cap` as keywords.
    coordinator_class: Callable[..., Coordinator] = Coordinator
    dead_letter: Target | None = None

    def __post_init__(self) -> None:
        refusing = [t.name for t in self.targets if bad_rows_of(t) is not None]
        if refusing and self.dead_letter is None:
            raise ValueError(
                f"targets {refusing} refuse rows (bad_rows) but the scenario has no "
                "dead_letter target: give Scenario(dead_letter=...) one"
            )


# -- generated data ----------------------------------------------------------------------------
# U+0000 is left out: Postgres text cannot hold it (its sink refuses such batches with a
# SchemaMismatchError, tested on its own).
_text = st.one_of(
    st.none(),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
)
_values = st.tuples(
    st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    _text,
    st.one_of(st.none(), st.floats(allow_nan=False)),
    st.one_of(st.none(), st.booleans()),
)
#: An epoch: a list of batches, each a list of rows without their key (0 to 4 batches of 0 to
#: 6 rows: empty epochs and empty batches included).
epoch_data = st.lists(st.lists(_values, max_size=6), max_size=4)


def epoch_rows(epoch: int, data: list[list[tuple[Any, ...]]]) -> list[list[Row]]:
    """Rows of an epoch with their keys (`<epoch>:<batch>:<row>`, unique across epochs)."""
    return [
        [(f"{epoch}:{b}:{r}", *values) for r, values in enumerate(batch)]
        for b, batch in enumerate(data)
    ]


def to_batches(rows: list[list[Row]]) -> list[pa.RecordBatch]:
    return [
        pa.RecordBatch.from_pylist([dict(zip(COLUMNS, row, strict=True)) for row in batch], SCHEMA)
        for batch in rows
    ]


def flat(rows: list[list[Row]]) -> list[Row]:
    return [row for batch in rows for row in batch]


def plain(row: Row) -> Row:
    """A row as its dead letter's `row_json` gives it back: non-finite floats as strings."""
    return tuple(
        ("NaN" if math.isnan(v) else "Infinity" if v > 0 else "-Infinity")
        if isinstance(v, float) and not math.isfinite(v)
        else v
        for v in row
    )


# -- crash points -------------------------------------------------------------------------------
#: A crash: abandon the run after the n-th step of this kind.
Crash = tuple[str, int]

EPOCH_STEP_KINDS = (
    "epoch-start",
    "after-begin",
    "after-write",
    "after-pre-commit",
    "after-decision",
    "after-commit",
    "after-finish",
)
RECOVERY_STEP_KINDS = ("recovery:after-fence", "recovery:after-open", "recovery:after-resolve")


def step_kind(step: str) -> str:
    """`after-write:3:files` -> `after-write`; `recovery:after-open:files` ->
    `recovery:after-open`."""
    parts = step.split(":")
    return ":".join(parts[:2]) if parts[0] == "recovery" else parts[0]


epoch_crashes = st.tuples(st.sampled_from(EPOCH_STEP_KINDS), st.integers(0, 1))
recovery_crashes = st.tuples(st.sampled_from(RECOVERY_STEP_KINDS), st.integers(0, 1))
