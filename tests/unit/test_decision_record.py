"""Decision records serialise canonically and refuse damaged input loudly."""

from __future__ import annotations

import json

import pytest

from durable_sinks.core import CommitHandle
from durable_sinks.core.errors import CorruptRecordError, ManifestCorruptError, StoredFormatError
from durable_sinks.core.protocol import JSON
from durable_sinks.manifest import DecisionRecord


def record(epoch: int = 3) -> DecisionRecord:
    handles = (
        CommitHandle("pg", epoch, "ds:j:pg:3:0:1-0", 10, 100, "abc", {"gid": "x"}),
        CommitHandle("files", epoch, "ds:j:files:3:0:1-0", 10, 90, "def", {}),
    )
    return DecisionRecord("j", epoch, 1, handles, created_at=1.5)


def test_round_trip() -> None:
    original = record()
    copy = DecisionRecord.from_bytes(original.to_bytes(), source="test")
    assert copy == original
    assert copy.created_at == 1.5
    assert copy.rows() == {"pg": 10, "files": 10}
    assert copy.commits(original.handles[0])
    assert not copy.commits(CommitHandle("pg", 3, "ds:j:pg:3:0:2-0", 10, 100, "abc"))


def test_serialisation_is_canonical() -> None:
    assert record().to_bytes() == record().to_bytes()


@pytest.mark.parametrize(
    "details", [{}, {"gid": "x"}, {"ü": ["é", 1.25, None, {"b": 1, "a": '\n"\\'}]}]
)
def test_the_envelope_is_the_canonical_json_of_its_parts(details: dict[str, JSON]) -> None:
    """The record's body is spliced into the envelope as it is: the bytes are those of the
    envelope's canonical JSON (sorted keys, no spaces, UTF-8), which readers check."""
    handle = CommitHandle("pg", 3, "ds:j:pg:3:0:1-0", 10, 100, "abc", details)
    made = DecisionRecord("j", 3, 1, (handle,), created_at=1234.000123, source="ü")
    envelope = json.loads(made.to_bytes())
    canonical = json.dumps(envelope, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert made.to_bytes() == (canonical + "\n").encode()
    assert DecisionRecord.from_bytes(made.to_bytes(), source="test") == made


@pytest.mark.parametrize("cut", [1, 10, 50, -2])
def test_truncated_record_is_an_error_naming_the_source(cut: int) -> None:
    data = record().to_bytes()[:cut]
    with pytest.raises(ManifestCorruptError, match=r"store/000003\.json"):
        DecisionRecord.from_bytes(data, source="store/000003.json")


def test_tampered_record_fails_its_checksum() -> None:
    envelope = json.loads(record().to_bytes())
    envelope["record"]["handles"][0]["rows"] = 11
    with pytest.raises(ManifestCorruptError, match="checksum"):
        DecisionRecord.from_bytes(json.dumps(envelope).encode(), source="x")


def test_unknown_version_is_refused() -> None:
    envelope = json.loads(record().to_bytes())
    envelope["version"] = 99
    with pytest.raises(StoredFormatError, match=r"decision record version 99 .* reads version 1"):
        DecisionRecord.from_bytes(json.dumps(envelope).encode(), source="x")


def test_other_json_is_refused() -> None:
    with pytest.raises(ManifestCorruptError, match="not a durable-sinks decision"):
        DecisionRecord.from_bytes(b'{"hello": 1}', source="x")


def test_handle_json_round_trip_and_version_check() -> None:
    handle = record().handles[0]
    assert CommitHandle.from_json(json.loads(handle.dumps())) == handle
    with pytest.raises(StoredFormatError, match="commit handle version 2"):
        CommitHandle.from_json({**handle.to_json(), "version": 2})
    with pytest.raises(CorruptRecordError, match="malformed"):
        CommitHandle.from_json({"version": 1, "sink": "x"})


def test_the_content_summary_round_trips_and_is_optional() -> None:
    from durable_sinks.core.content import ContentSummary

    plain = record()
    assert "content" not in plain.to_json()  # records written before it parse as before
    summarised = DecisionRecord(
        "j", 3, 1, plain.handles, created_at=1.5, content=ContentSummary(20, "00ff00ff00ff00ff")
    )
    assert summarised.to_json()["content"] == {
        "rows": 20,
        "digest": "00ff00ff00ff00ff",
        "algorithm": "rowsum64-1",
    }
    copy = DecisionRecord.from_bytes(summarised.to_bytes(), source="test")
    assert copy.content == summarised.content
    assert DecisionRecord.from_json(plain.to_json()).content is None
    assert summarised == plain  # the summary does not take part in comparing decisions
    damaged = {**summarised.to_json(), "content": {"digest": "x"}}
    with pytest.raises(ManifestCorruptError, match="malformed"):
        DecisionRecord.from_json(damaged, source="test")
