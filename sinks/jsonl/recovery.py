"""What the folder holds when a sink opens: the epochs committed, and what earlier
generations of the job left in the staging area.

Ownership is by name: a staging folder belongs to (job, sink) when its participant name says
so, and to a generation by the same name: staging folders of other jobs or sinks are never
touched. Published folders are named by epoch and part only, so a folder holds one sink of
one job: the published markers name both, and a folder another one published into is
refused at open.
"""

from __future__ import annotations

from pathlib import Path

from durable_sinks.core.durable_fs import remove_tree
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle, OpenContext

from .handles import JsonlHandle
from .layout import Layout, read_marker


def last_committed(layout: Layout, context: OpenContext) -> int | None:
    """The highest epoch with a published marker; ConfigError when another job or another
    sink published into the folder (published names carry neither: one sink per folder)."""
    best: int | None = None
    for epoch, folder in layout.epochs():
        for part in folder.glob("part=*"):
            marker = read_marker(part)
            if marker is None:
                continue
            owner = JsonlHandle.parse(marker).details.job_id
            if (owner, marker.sink) != (context.job_id, context.sink):
                raise ConfigError(
                    f"{part} was written by job {owner!r} (sink {marker.sink!r}), not by job "
                    f"{context.job_id!r} (sink {context.sink!r})",
                    job=context.job_id,
                    sink=context.sink,
                    fix="give each jsonl sink of each job its own path",
                )
            best = epoch if best is None else max(best, epoch)
    return best


def leftovers(layout: Layout, context: OpenContext) -> list[CommitHandle]:
    """Participants of this job and sink that older generations prepared (their handles),
    after removing those they left unprepared: nothing can ever commit a participant without
    a handle."""
    prepared: list[CommitHandle] = []
    for name, folder in owned_staging(layout, context):
        if name.generation >= context.generation:
            continue  # this generation's, or a newer coordinator's: not leftovers
        handle = _prepared(folder)
        if handle is None:
            remove_tree(folder)
        else:
            prepared.append(handle)
    return prepared


def prepared_of_epoch(layout: Layout, context: OpenContext, epoch: int) -> list[CommitHandle]:
    """Every prepared participant of `epoch` of this job and sink, of any generation (the
    winning and the losing attempts of each part, in executor mode)."""
    found = []
    for name, folder in owned_staging(layout, context):
        handle = _prepared(folder) if name.epoch == epoch else None
        if handle is not None:
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


def _prepared(folder: Path) -> CommitHandle | None:
    """The handle of a staging folder that holds a marker (None: still being written, or
    abandoned before its prepare finished)."""
    return read_marker(folder)
