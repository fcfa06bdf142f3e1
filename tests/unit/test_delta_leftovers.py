"""What `durable-sinks drop` removes of a Delta sink in a local table's folder
(sinks/delta/operations.drop_leftovers): the emptied epoch folders and stray files of the
job's own `_durable_sinks/<job>/<sink>/`, never a file reached through a symbolic link, never
another job's folder or the table's data."""

from __future__ import annotations

from pathlib import Path

from durable_sinks.sinks.delta.config import Delta
from durable_sinks.sinks.delta.layout import Layout
from durable_sinks.sinks.delta.operations import drop_leftovers
from durable_sinks.sinks.delta.storage import TableStorage


def test_drop_leftovers_removes_the_jobs_folders_and_follows_no_link(tmp_path: Path) -> None:
    table = tmp_path / "table"
    storage = TableStorage(Delta(path=str(table)))
    ours, other = Layout("job", "delta"), Layout("other", "delta")
    for layout in (ours, other):
        (table / layout.epoch_folder(0)).mkdir(parents=True)
    (table / ours.epoch_folder(1)).mkdir()
    (table / ours.epoch_folder(1) / "p0_g1a0-00000.parquet").write_bytes(b"staged")
    (table / "part-00000.parquet").write_bytes(b"data")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.parquet").write_bytes(b"not the job's")
    (table / ours.folder / "link").symlink_to(outside)

    listed = drop_leftovers(storage, ours, apply=False)
    assert [(b.what, b.count) for b in listed] == [
        ("staging leftovers", 1),
        ("journal folders (empty)", 3),
    ]
    assert (table / ours.epoch_folder(1) / "p0_g1a0-00000.parquet").exists()

    drop_leftovers(storage, ours, apply=True)
    assert (outside / "keep.parquet").read_bytes() == b"not the job's"
    assert not (table / ours.epoch_folder(0)).exists()
    assert not (table / ours.epoch_folder(1)).exists()
    assert (table / other.epoch_folder(0)).is_dir()
    assert (table / "part-00000.parquet").exists()
    # The link stays (the folder holding it too): nothing behind it is the job's to remove.
    assert (table / ours.folder / "link").is_symlink()
    (table / ours.folder / "link").unlink()
    drop_leftovers(storage, ours, apply=True)
    assert not (table / ours.folder).exists()
    assert not (table / ours.folder).parent.exists()
    assert drop_leftovers(storage, ours, apply=False) == []
