"""State read back from storage is checked before it names anything to touch: a commit handle
found in a leftover's marker or a decision must name a participant of the job's own sink and
epoch (coordinator/_participants.py `require_own`), or the start stops with
CorruptRecordError, nothing removed or committed for it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator
from durable_sinks.core.errors import CorruptRecordError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import MARKER, STAGING, Files, FolderSink


def job(tmp_path: Path) -> Coordinator:
    return Coordinator(
        "job",
        [FolderSink(Files(str(tmp_path / "out"), name="out"))],
        LocalDirectoryStore(tmp_path / "store"),
        source="query-1",
    )


def leftover(tmp_path: Path) -> Path:
    """A participant prepared by a driver that died before the decision: its marker."""
    crashed = job(tmp_path)
    crashed.start()
    steps = crashed.epoch_steps(0, [pa.record_batch({"id": [1, 2]})])
    for step in steps:
        if step == "after-pre-commit:out":
            break
    (folder,) = (tmp_path / "out" / STAGING).glob("ds:*")
    return folder / MARKER


def victim(tmp_path: Path) -> Path:
    """A folder outside the dataset that its user can write."""
    outside = tmp_path / "elsewhere" / "precious"
    outside.mkdir(parents=True)
    (outside / "data.txt").write_text("keep me")
    return outside


@pytest.mark.parametrize(
    "forged",
    [
        "absolute path",
        "parent path",
        "another job's participant",
        "another sink's participant",
        "another epoch's participant",
    ],
)
def test_a_forged_leftover_marker_is_refused_and_nothing_outside_is_touched(
    tmp_path: Path, forged: str
) -> None:
    marker = leftover(tmp_path)
    handle = json.loads(marker.read_text())
    real = handle["participant"]
    outside = victim(tmp_path)
    handle["participant"] = {
        "absolute path": str(outside),
        "parent path": "../../elsewhere/precious",
        "another job's participant": real.replace(":job:", ":other-job:", 1),
        "another sink's participant": real.replace(":out:", ":other:", 1),
        "another epoch's participant": real.replace(":out:0:", ":out:7:", 1),
    }[forged]
    marker.write_text(json.dumps(handle))

    with pytest.raises(CorruptRecordError, match="not one of its own") as raised:
        job(tmp_path).start()
    assert raised.value.sink == "out"
    assert "remove the record" in (raised.value.fix or "")
    assert (outside / "data.txt").read_text() == "keep me"
    assert marker.exists()  # left for the operator to look at


def test_a_leftover_with_its_own_marker_is_rolled_back(tmp_path: Path) -> None:
    marker = leftover(tmp_path)
    report = job(tmp_path).start()
    assert [h.participant for h in report.rolled_back] == [marker.parent.name]
    assert not marker.parent.exists()


def test_a_decided_handle_whose_part_is_a_path_publishes_nothing(tmp_path: Path) -> None:
    """A decision (from a store anyone may write) whose files handle names a part outside
    the epoch's folder: refused, nothing renamed there."""
    from durable_sinks.core import CommitHandle

    marker = leftover(tmp_path)
    handle = CommitHandle.from_json(json.loads(marker.read_text()))
    forged = CommitHandle.from_json(
        {**handle.to_json(), "details": {**handle.to_json()["details"], "part": "../../x"}}  # type: ignore[dict-item]
    )
    sink = job(tmp_path)
    sink.start(recover=False)
    with pytest.raises(CorruptRecordError, match="not its own"):
        sink.sinks[0].commit_epoch(0, forged)
    assert not (tmp_path / "out" / "epoch=0").exists()
    assert marker.exists()  # still prepared, where it was


def delta_job(tmp_path: Path) -> Coordinator:
    from durable_sinks.sinks import create

    sink = create("delta", {"path": str(tmp_path / "table"), "create_table": True})
    return Coordinator("job", [sink], LocalDirectoryStore(tmp_path / "store"), source="q")


@pytest.mark.parametrize("forged", ["relative", "absolute"])
def test_a_forged_delta_journal_is_refused_and_nothing_outside_is_deleted(
    tmp_path: Path, forged: str
) -> None:
    """A Delta participant's journal (in the table's _durable_sinks folder) lists the files
    its recovery deletes: one that lists a file outside the participant's own is refused."""
    crashed = delta_job(tmp_path)
    crashed.start()
    for step in crashed.epoch_steps(0, [pa.record_batch({"id": [1, 2]})]):
        if step == "after-pre-commit:delta":
            break
    (journal,) = (tmp_path / "table" / "_durable_sinks").rglob("*.json")
    written = json.loads(journal.read_text())
    outside = victim(tmp_path)
    written["handle"]["details"]["files"][0]["path"] = {
        "relative": "../../elsewhere/precious/data.txt",
        "absolute": str(outside / "data.txt"),
    }[forged]
    journal.write_text(json.dumps(written))

    with pytest.raises(CorruptRecordError, match="not one of its own"):
        delta_job(tmp_path).start()
    assert (outside / "data.txt").read_text() == "keep me"
    assert journal.exists()


def test_the_delta_layout_owns_only_its_participants_files() -> None:
    from durable_sinks.core.naming import ParticipantName
    from durable_sinks.sinks.delta.layout import Layout

    layout = Layout("job", "delta")
    name = ParticipantName.build("job", "delta", 3, "p0", 2, 0)
    other = ParticipantName.build("job", "delta", 3, "p1", 2, 0)
    own = [layout.staged(name, 0), layout.data_file(name, 1, {"day": "d1"}, "zstd")]
    assert all(layout.owns(name, p) for p in own)
    assert not any(layout.owns(other, p) for p in own)
    for foreign in ["/abs/x.parquet", "../x.parquet", f"a/../{own[1]}", "s3://b/x", own[1] + "\\"]:
        assert not layout.owns(name, foreign), foreign


def test_a_leftover_marker_that_is_not_json_is_a_typed_error_naming_it(tmp_path: Path) -> None:
    """A staging folder's marker holding garbage: CorruptRecordError naming the file (before:
    a raw JSONDecodeError left the sink)."""
    leftover(tmp_path).write_bytes(b"\x00not json{")
    with pytest.raises(CorruptRecordError, match=r"_EPOCH\.json: not a commit handle"):
        job(tmp_path).start()
