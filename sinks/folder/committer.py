"""Phase 2 of one participant, from its handle alone: commit (publish) or roll back.

Both work in any process, on a fresh sink instance that wrote nothing (recovery, or the
driver committing what an executor prepared), and both are idempotent:

- `commit` renames the staging folder to its published place with a create-only rename
  (renameat2 RENAME_NOREPLACE, core/durable_fs.py), then fsyncs the folders whose names
  changed. The newest-epoch pointer's entry of the epoch is created before the rename and
  older epochs' entries removed after it (layout.py). When the published place already
  holds this participant's marker, the participant was committed before:
  ALREADY_COMMITTED. When it holds another participant's (two attempts of one part: only
  the decided one is ever committed), or when the participant is neither staged nor
  published, data was removed behind the job's back: ParticipantLostError.
- `rollback` removes the staging folder if it is there. It never touches a published folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from durable_sinks.core.durable_fs import fsync_dir, remove_tree, rename_noreplace
from durable_sinks.core.errors import ParticipantLostError
from durable_sinks.core.protocol import CommitOutcome

from .handles import FolderHandle
from .layout import MARKER, Layout, read_marker


def commit(
    layout: Layout, parsed: FolderHandle, *, fsync: bool, where: dict[str, Any]
) -> CommitOutcome:
    """Publish the participant of `parsed` (`where`: the job, sink and epoch its errors
    name)."""
    handle = parsed.handle
    staging = layout.staging(handle.participant)
    target = layout.published(handle.epoch, parsed.details.part)
    if holder(target) == handle.participant:
        return CommitOutcome.ALREADY_COMMITTED
    if not (staging / MARKER).exists():
        raise ParticipantLostError(
            f"participant {handle.participant} is neither prepared in {staging.parent} nor "
            f"published at {target}",
            **where,
            fix="files of this folder were removed by hand; the epoch must be rewritten",
        )
    layout.announce(handle.epoch, fsync=fsync)  # before the rename: layout.py
    target.parent.mkdir(exist_ok=True)
    try:
        rename_noreplace(staging, target)
    except FileExistsError:
        found = holder(target)
        if found == handle.participant:  # a concurrent commit of the same handle won
            return CommitOutcome.ALREADY_COMMITTED
        raise ParticipantLostError(
            f"{target} already holds participant {found}, not {handle.participant}", **where
        ) from None
    if fsync:
        # The new name, the epoch folder's name and the staging folder's removal.
        fsync_dir(target.parent)
        fsync_dir(layout.root)
        fsync_dir(layout.staging_area)
    layout.retire_below(handle.epoch)
    return CommitOutcome.COMMITTED


def rollback(layout: Layout, participant: str, *, fsync: bool) -> bool:
    """Remove the participant's staging folder; True if there was one."""
    staging = layout.staging(participant)
    if not remove_tree(staging):
        return False
    if fsync:
        fsync_dir(layout.staging_area)
    return True


def holder(folder: Path) -> str | None:
    """The participant whose marker `folder` holds, if any."""
    marker = read_marker(folder)
    return None if marker is None else marker.participant
