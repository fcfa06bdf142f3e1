"""Typed, versioned handle details: what a sink writes into a commit handle reads back as it
was, and anything else is one error naming the participant."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from durable_sinks.core.errors import CorruptRecordError, StoredFormatError
from durable_sinks.core.handles import HandleDetails
from durable_sinks.core.protocol import CommitHandle


@dataclass(frozen=True)
class Piece:
    key: str
    etags: tuple[str, ...] = ()
    size: int | None = None


@dataclass(frozen=True)
class Details(HandleDetails):
    job_id: str
    pieces: tuple[Piece, ...]
    ratio: float = 1.0
    extra: Mapping[str, Any] | None = None


def handle(details: Mapping[str, Any]) -> CommitHandle:
    return CommitHandle("s", 4, "ds:j:s:4:0:1:0", 1, 1, "", dict(details))


def test_details_round_trip_through_a_handle_and_its_json() -> None:
    details = Details("j", (Piece("a", ("e1", "e2"), 10), Piece("b")), 2.5, {"x": [1]})
    stored = json.loads(handle(details.to_json()).dumps())
    assert stored["details"]["v"] == 1
    assert Details.of(CommitHandle.from_json(stored)) == details


def test_details_written_before_they_carried_a_version_read_as_version_one() -> None:
    assert Details.of(handle({"job_id": "j", "pieces": [{"key": "a"}], "ratio": 3})) == Details(
        "j", (Piece("a"),), 3.0
    )


@pytest.mark.parametrize(
    ("details", "problem"),
    [
        ({"pieces": []}, "has no 'job_id'"),
        ({"job_id": 7, "pieces": []}, "details.job_id is 7"),
        ({"job_id": "j", "pieces": {"key": "a"}}, "not a list"),
        ({"job_id": "j", "pieces": [{"etags": []}]}, r"details.pieces\[0\] has no 'key'"),
        ({"job_id": "j", "pieces": [{"key": "a", "size": True}]}, "size is True"),
        ({"job_id": "j", "pieces": [], "v": "one"}, "not a version"),
    ],
)
def test_malformed_details_are_one_error_naming_the_participant(
    details: dict[str, Any], problem: str
) -> None:
    with pytest.raises(CorruptRecordError, match=problem) as raised:
        Details.of(handle(details))
    assert "ds:j:s:4:0:1:0" in str(raised.value)
    assert raised.value.epoch == 4
    assert raised.value.fix


def test_details_of_a_newer_format_are_refused_not_guessed() -> None:
    newer = r"Details \(a commit handle's details\) version 2 .* this release reads version 1"
    with pytest.raises(StoredFormatError, match=newer) as raised:
        Details.of(handle({"v": 2, "job_id": "j", "pieces": []}))
    assert raised.value.epoch == 4
    assert "upgrade durable-sinks" in (raised.value.fix or "")


def test_an_older_format_is_upgraded_in_one_place() -> None:
    @dataclass(frozen=True)
    class Renamed(HandleDetails):
        VERSION: ClassVar[int] = 2
        owner: str

        @classmethod
        def _upgrade(cls, version: int, data: dict[str, Any]) -> dict[str, Any]:
            return {"owner": data.pop("job_id")} if version == 1 else data

    assert Renamed.of(handle({"job_id": "j"})) == Renamed("j")
    assert Renamed("k").to_json() == {"v": 2, "owner": "k"}


def test_a_handles_details_are_parsed_once_per_class_and_malformed_ones_every_time() -> None:
    one = handle(Details("j", (Piece("a"),)).to_json())
    assert Details.of(one) is Details.of(one)  # one epoch's commit reads them several times
    twin = handle(Details("j", (Piece("a"),)).to_json())
    assert Details.of(twin) == Details.of(one)
    assert Details.of(twin) is not Details.of(one)  # another handle: its own parse
    bad = handle({"job_id": "j", "pieces": "no"})
    for _ in range(2):
        with pytest.raises(CorruptRecordError):
            Details.of(bad)
