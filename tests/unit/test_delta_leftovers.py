"""What `durable-sinks drop` and the running job's expiry remove of a Delta sink in a local
table's folder (sinks/delta/operations.drop_leftovers, expire_epoch_folders): the emptied
epoch folders (and, for drop, stray files) of the job's own `_durable_sinks/<job>/<sink>/`,
never a file reached through a symbolic link, never another job's folder or the table's
data."""

from __future__ import annotations

from pathlib import Path

from durable_sinks.sinks.delta.config import Delta
from durable_sinks.sinks.delta.layout import Layout
from durable_sinks.sinks.delta.operations import drop_leftovers, expire_epoch_folders
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


def test_expiry_removes_empty_epoch_folders_below_the_window_and_nothing_else(
    tmp_path: Path,
) -> None:
    """expire_epoch_folders: the first call lists the sink's folder, later ones go by name
    from where the previous one stopped; a folder holding something, a symbolic link,
    another job's folders and other names stay."""
    table = tmp_path / "table"
    storage = TableStorage(Delta(path=str(table)))
    ours, other = Layout("job", "delta"), Layout("other", "delta")
    for epoch in range(8):
        (table / ours.epoch_folder(epoch)).mkdir(parents=True)
    (table / other.epoch_folder(0)).mkdir(parents=True)
    (table / ours.epoch_folder(2) / "p0_g1a0.json").write_text("{}")  # not settled yet
    outside = tmp_path / "outside"
    outside.mkdir()
    (table / ours.epoch_folder(7)).rmdir()
    (table / ours.epoch_folder(7)).symlink_to(outside)
    (table / ours.folder / "notes").mkdir()

    assert expire_epoch_folders(storage, ours, 5, None) == (4, 5)  # 0, 1, 3, 4
    left = sorted(p.name for p in (table / ours.folder).iterdir())
    assert left == ["e000000000002", "e000000000005", "e000000000006", "e000000000007", "notes"]
    assert (table / other.epoch_folder(0)).is_dir()
    # By name from 5: 5 and 6 go, 7 is a link and stays (its target untouched).
    (table / ours.epoch_folder(2) / "p0_g1a0.json").unlink()
    assert expire_epoch_folders(storage, ours, 9, 5) == (2, 9)
    assert (table / ours.epoch_folder(2)).is_dir()  # below the start: the next listing's
    assert (table / ours.epoch_folder(7)).is_symlink()
    assert outside.is_dir()
