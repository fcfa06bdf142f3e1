"""Participant names round-trip and stay within Postgres's gid limit; errors pickle."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_sinks.core import errors
from durable_sinks.core.naming import MAX_BYTES, ParticipantName, component, owner_prefix


@given(
    job=st.text(min_size=1, max_size=300),
    sink=st.text(min_size=1, max_size=300),
    epoch=st.integers(0, 2**63 - 1),
    part=st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True),
    generation=st.integers(0, 2**40),
    attempt=st.integers(0, 10**6),
)
def test_names_round_trip_within_the_gid_limit(
    job: str, sink: str, epoch: int, part: str, generation: int, attempt: int
) -> None:
    name = ParticipantName.build(job, sink, epoch, part, generation, attempt)
    text = str(name)
    assert len(text.encode()) <= MAX_BYTES
    assert ParticipantName.parse(text) == name
    assert name.owned_by(job, sink)
    assert text.startswith(owner_prefix(job, sink))


def test_unsafe_or_long_components_are_hashed_and_distinct() -> None:
    assert component("orders") == "orders"
    assert component("a:b").startswith("h-")
    assert component("x" * 41).startswith("h-")
    assert component("h-lookalike").startswith("h-")  # never mistaken for a hashed name
    assert component("a:b") != component("a;b")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "ds",
        "ds:a:b:c:0:1-0",
        "xx:a:b:1:0:1-0",
        "ds:a:b:1:0:1",
        "ds:a:b:1:0:1-0:extra",
        "ds:a b:b:1:0:1-0",
        "some-foreign-gid",
    ],
)
def test_foreign_names_parse_to_none(text: str) -> None:
    assert ParticipantName.parse(text) is None


def test_build_rejects_bad_parts() -> None:
    with pytest.raises(ValueError, match="part"):
        ParticipantName.build("j", "s", 1, "a:b", 1, 0)
    with pytest.raises(ValueError, match=">= 0"):
        ParticipantName.build("j", "s", -1, "0", 1, 0)


ERROR_CLASSES = [
    cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, errors.DurableSinkError)
]


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_errors_pickle_with_their_context(cls: type[errors.DurableSinkError]) -> None:
    error = cls("something broke", job="orders", sink="pg", epoch=7, fix="do the thing")
    error.extra = "kept"  # type: ignore[attr-defined]
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert type(copy) is cls
    assert (
        str(copy)
        == str(error)
        == ("[job=orders, sink=pg, epoch=7] something broke Fix: do the thing")
    )
    assert (copy.job, copy.sink, copy.epoch, copy.fix) == ("orders", "pg", 7, "do the thing")
    assert copy.extra == "kept"  # type: ignore[attr-defined]
    assert copy.retriable is cls.retriable


def test_retriable_classes() -> None:
    assert errors.TransientError.retriable
    assert errors.InDoubtError.retriable
    assert not errors.FencedError.retriable
    assert not errors.ConfigError.retriable


def test_a_fenced_error_always_carries_a_fix() -> None:
    """A FencedError raised without one (the decision stores, the files sink) still tells the
    user what to do: a second driver owns the job."""
    from durable_sinks.core.errors import FENCED_FIX, FencedError

    error = FencedError("a newer coordinator took over this job", job="orders", epoch=3)
    assert error.fix == FENCED_FIX
    assert str(error).endswith(f"Fix: {FENCED_FIX}")
    assert "restart the query from its checkpoint" in FENCED_FIX
    assert FencedError("x", fix="own fix").fix == "own fix"
    assert pickle.loads(pickle.dumps(error)).fix == FENCED_FIX  # noqa: S301 - our own bytes


def test_a_part_names_its_slice_and_siblings_are_other_slices_of_the_same_epoch() -> None:
    def name(part: str, epoch: int = 3, generation: int = 2, sink: str = "pg") -> ParticipantName:
        return ParticipantName.build("job", sink, epoch, part, generation, 0)

    assert name("p3-t17").slice == "p3"
    assert name("p3-t17-0a1b2c3d").slice == "p3"
    assert name("0").slice == "0"
    assert name("p0-t1").sibling_of(name("p1-t2"))
    assert not name("p0-t1").sibling_of(name("p0-t9"))  # another attempt at the same slice
    assert not name("p0-t1").sibling_of(name("p1-t2", epoch=4))
    assert not name("p0-t1").sibling_of(name("p1-t2", generation=1))
    assert not name("p0-t1").sibling_of(name("p1-t2", sink="other"))
