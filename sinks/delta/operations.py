"""What `durable-sinks` reads of a Delta sink (core/operations.py): the participants whose
journals are on the table (prepared or half-written), and per epoch the commit that carries it
(its participants, rows and time, from the commit info). Read only, but for `drop_leftovers`
and `expire_epoch_folders`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.operations import Bookkeeping, Holding, Prepared

from .handles import journal_handle, journal_paths, leftover, paths_of
from .layout import COMMIT_INFO, COMMIT_VERSION_KEY, ROOT, Layout

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from .storage import TableStorage


def in_doubt(
    journals: Sequence[tuple[ParticipantName, Mapping[str, Any]]], sink: str
) -> list[Prepared]:
    found = []
    for name, journal in journals:
        handle = journal_handle(journal) or leftover(name, journal, sink)
        paths = paths_of(handle) or journal_paths(journal)
        what = f"{journal.get('state')} participant with {len(paths)} file(s)"
        found.append(Prepared(handle, what, None, handle.bytes or None))
    return found


def holdings(table: DeltaTable, first: int, last: int) -> dict[int, Holding]:
    found = {}
    for commit in table.history():
        epoch = commit.get("durable_sinks.epoch")
        participants = commit.get("durable_sinks.participants")
        if epoch is None or not first <= int(epoch) <= last:
            continue
        version = commit.get(COMMIT_VERSION_KEY)
        COMMIT_INFO.check(
            int(version) if isinstance(version, str) and version.isdigit() else version,
            source=f"the table commit of epoch {epoch}",
        )
        metrics = commit.get("operationMetrics") or {}
        rows = metrics.get("num_added_rows") or metrics.get("num_source_rows")
        found[int(epoch)] = Holding(
            int(epoch),
            marker=True,
            participants=frozenset(json.loads(participants or "[]")),
            rows=int(rows) if rows is not None else None,
            at=float(commit["timestamp"]) / 1000 if "timestamp" in commit else None,
        )
    return found


def drop_leftovers(storage: TableStorage, layout: Layout, *, apply: bool) -> list[Bookkeeping]:
    """What the job's sink left in its own folder `_durable_sinks/<job>/<sink>/` once no
    participant is in doubt: files (staged rows no journal names) and the emptied epoch
    folders of a local table (S3 has none); with `apply` removed, the job's folder
    `_durable_sinks/<job>/` too once empty. Every path is listed under that folder and
    checked to lie there, no symbolic link followed; the table's data files and log are
    never touched."""
    folder = layout.folder
    files = [
        f.path
        for f in storage.list(folder)
        if _under(f.path, folder) and storage.inside(f.path, folder)
    ]
    job_folder = folder.rsplit("/", 1)[0]
    folders = [f for f in storage.folders(folder) if f == folder or _under(f, folder)]
    where = f"{storage.where}/{folder}"
    found = []
    if files:
        found.append(Bookkeeping("staging leftovers", where, len(files)))
    if folders:
        found.append(Bookkeeping("journal folders (empty)", where, len(folders)))
    if apply:
        storage.delete(files)
        for relative in folders:
            storage.remove_empty_folder(relative)
        if folders and job_folder.startswith(f"{ROOT}/"):
            storage.remove_empty_folder(job_folder)
    return found


def expire_epoch_folders(
    storage: TableStorage, layout: Layout, before_epoch: int, start: int | None
) -> tuple[int, int]:
    """Remove the emptied epoch folders `e<epoch>` of the sink's folder for epochs below
    `before_epoch` on a local table: those from `start` on by name, or, with `start` None,
    those one listing of the sink's folder finds. A folder that holds anything (a journal or
    staged rows recovery has not settled) or is a symbolic link stays. Returns how many were
    removed and where the next call starts."""
    if start is None:
        named = map(layout.folder_epoch, storage.children(layout.folder))
        epochs = sorted(e for e in named if e is not None)
    else:
        epochs = list(range(start, before_epoch))
    removed = 0
    for epoch in epochs:
        if epoch >= before_epoch:
            break
        relative = layout.epoch_folder(epoch)
        if not Path(storage.full_path(relative)).is_symlink() and storage.remove_empty_folder(
            relative
        ):
            removed += 1
    return removed, before_epoch if start is None else max(start, before_epoch)


def _under(path: str, folder: str) -> bool:
    rest = path[len(folder) + 1 :] if path.startswith(f"{folder}/") else ""
    return bool(rest) and ".." not in rest.split("/")
