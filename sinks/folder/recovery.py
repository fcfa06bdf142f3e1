"""What the folder holds when a sink opens: the epochs committed, the schema they were
written in, and what earlier generations of the job left in the staging area.

Ownership is by name: a staging folder belongs to (job, sink) when its participant name says
so, and to a generation by the same name: staging folders of other jobs or sinks are never
touched. Published folders are named by epoch and part only, so a folder holds one sink of
one job: the published markers name both, and a folder another one published into is
refused at open.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_sinks.core.durable_fs import remove_tree
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.evolution import unify
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle, OpenContext

from .handles import FolderHandle
from .layout import Layout, read_marker
from .reader import part_schemas

if TYPE_CHECKING:
    import pyarrow as pa


def last_committed(
    layout: Layout, context: OpenContext, *, fsync: bool, listed: bool = False
) -> int | None:
    """The highest epoch with a published marker. Read from the newest-epoch pointer
    (layout.py): the newest announced epoch whose folder holds a marker, so an open costs the
    same whatever the number of epochs published. Without such an epoch, from the folder's
    `epoch=*` names, newest first, down to the first epoch with a marker (a folder without
    one is an epoch whose publish was cut short); that open then creates the pointer's entry
    of the epoch it found (unless it only inspects). ConfigError when a marker read names
    another job or another sink (published names carry neither: one sink per folder): a
    folder two jobs publish into is refused by the open that follows the other's publish.
    `listed`: from the names alone, whatever the pointer says."""
    for epoch in [] if listed else layout.announced():
        if _published(layout.epoch_folder(epoch), context):
            return epoch
    for epoch, folder in layout.epochs_newest_first():
        if _published(folder, context):
            if not context.inspect:
                layout.announce(epoch, fsync=fsync)
            return epoch
    return None


def _published(folder: Path, context: OpenContext) -> bool:
    """Whether an epoch folder holds a part with a marker (ConfigError when a marker names
    another job or sink)."""
    found = False
    for part in folder.glob("part=*"):
        marker = read_marker(part)
        if marker is None:
            continue
        owner = FolderHandle.parse(marker).details.job_id
        if (owner, marker.sink) != (context.job_id, context.sink):
            raise ConfigError(
                f"{part} was written by job {owner!r} (sink {marker.sink!r}), not by job "
                f"{context.job_id!r} (sink {context.sink!r})",
                job=context.job_id,
                sink=context.sink,
                fix="give each folder sink of each job its own path; to read this one, "
                f"open it as sink {marker.sink!r} of job {owner!r}",
            )
        found = True
    return found


def epoch_schema(layout: Layout, epoch: int, where: dict[str, Any]) -> pa.Schema | None:
    """The schema a committed epoch was written in: its parts' files' schemas unified (None
    if it has no file)."""
    parts = layout.committed_parts(range(epoch, epoch + 1))
    return unify((s for part in parts for s in part_schemas(part)), **where)


@dataclass
class Leftovers:
    """What older generations of the job left in the staging area: the participants they
    prepared (their handles, for the coordinator to commit or roll back by its decisions) and
    the staging folders they left unprepared, which `leftovers` removed."""

    prepared: list[CommitHandle] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def leftovers(layout: Layout, context: OpenContext) -> Leftovers:
    """Participants of this job and sink that older generations prepared, after removing
    those they left unprepared: nothing can ever commit a participant without a handle."""
    found = Leftovers()
    for name, folder in owned_staging(layout, context):
        if name.generation >= context.generation:
            continue  # this generation's, or a newer coordinator's: not leftovers
        handle = read_marker(folder)
        if handle is None:
            remove_tree(folder)
            found.removed.append(folder.name)
        else:
            found.prepared.append(handle)
    return found


def prepared_of_epoch(layout: Layout, context: OpenContext, epoch: int) -> list[CommitHandle]:
    """Every prepared participant of `epoch` of this job and sink, of any generation (the
    winning and the losing attempts of each part, in executor mode)."""
    found = []
    for name, folder in owned_staging(layout, context):
        handle = read_marker(folder) if name.epoch == epoch else None
        if handle is not None:  # else still being written (or abandoned): not prepared
            found.append(handle)
    return found


def owned_staging(layout: Layout, context: OpenContext) -> list[tuple[ParticipantName, Path]]:
    """The staging folders of this job and sink, any generation, with their names."""
    owned = []
    area = layout.staging_area
    for folder in sorted(area.iterdir()) if area.is_dir() else []:
        name = ParticipantName.parse(folder.name)
        if name is not None and name.owned_by(context.job_id, context.sink):
            owned.append((name, folder))
    return owned
