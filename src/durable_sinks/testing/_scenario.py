"""What the conformance suite writes and where it may crash: the scenario of one example
(targets and decision store), the generated epochs, and the crash points."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from hypothesis import strategies as st

from durable_sinks.coordinator import Coordinator
from durable_sinks.core import SinkConnector
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


@dataclass
class Scenario:
    """What one example runs against: the targets of one job and its decision store."""

    job_id: str
    targets: Sequence[Target]
    store: Callable[[], DecisionStore]
    cleanup: Callable[[], None] = lambda: None
    #: Builds the coordinator from (job_id, sinks, store), e.g. a `functools.partial` of
    #: Coordinator with options, or a subclass.
    coordinator_class: Callable[..., Coordinator] = Coordinator


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
