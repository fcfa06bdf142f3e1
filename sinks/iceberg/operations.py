"""What `durable-sinks` reads of an Iceberg sink (core/operations.py): the participants whose
data files lie in the table's data folder without the table holding them (prepared, or
half-written by a process that died), and per epoch the snapshot that committed it: its
participants (the summary's list), its rows and files (the snapshot's own manifests), each
file checked to be there. Read only."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.operations import Holding, Prepared
from durable_sinks.core.protocol import CommitHandle

from .layout import SUMMARY_PARTICIPANTS, Layout

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot


def added_data_files(table: Table, snapshot: Snapshot) -> Iterator[DataFile]:
    """The data files `snapshot` itself added (from its own manifests, not its parents')."""
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.snapshot_id == snapshot.snapshot_id:
                yield entry.data_file


def in_doubt(
    found: Mapping[ParticipantName, list[str]],
    leftover: Callable[[ParticipantName, list[str]], CommitHandle],
    open_file: Callable[[str], Any],
) -> list[Prepared]:
    """One entry per participant in `found` (its files outside the table), with their size."""
    listed = []
    for name, paths in sorted(found.items()):
        size = sum(len(open_file(p)) for p in paths)
        what = f"{len(paths)} data file{'s' if len(paths) != 1 else ''} outside the table"
        listed.append(Prepared(leftover(name, paths), what, None, size))
    return listed


def holdings(table: Table, job_id: str, sink: str, first: int, last: int) -> dict[int, Holding]:
    """Per epoch in `first..last` that a kept snapshot committed for this job's sink: the
    participants its summary names, the rows of the files it added (from its manifests), and
    what is wrong: an epoch committed twice, a file gone, a file of a participant the summary
    does not name."""
    layout = Layout(job_id, sink)
    found: dict[int, Holding] = {}
    for snapshot in table.snapshots():
        epoch = layout.epoch_of(snapshot.summary)
        if epoch is None or not first <= epoch <= last:
            continue
        listed = snapshot.summary.get(SUMMARY_PARTICIPANTS) if snapshot.summary else None
        named = frozenset(json.loads(listed or "[]"))
        rows = 0
        problems = []
        for data_file in added_data_files(table, snapshot):
            path = str(data_file.file_path)
            rows += int(data_file.record_count)
            writer = layout.parse(path)
            if writer is None or str(writer) not in named:
                problems.append(f"{path} is not a file of the participants the commit names")
            if not table.io.new_input(path).exists():
                problems.append(f"{path} is in the table but missing")
        earlier = found.get(epoch)
        if earlier is not None:  # the snapshots come oldest first: keep the first commit's
            twice = f"epoch {epoch} is committed by more than one snapshot"
            found[epoch] = Holding(
                epoch,
                marker=True,
                participants=earlier.participants,
                rows=earlier.rows,
                counted=True,
                at=earlier.at,
                problems=(*earlier.problems, *problems, twice),
            )
            continue
        found[epoch] = Holding(
            epoch,
            marker=True,
            participants=named,
            rows=rows,
            counted=True,
            at=snapshot.timestamp_ms / 1000,
            problems=tuple(problems),
        )
    return found
