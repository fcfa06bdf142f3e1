"""What the `durable-sinks` command shows of a folder sink (core/operations.py): the job's
prepared participants, and per epoch the published parts, their markers and their rows
counted on the data files themselves (the encoder reads them: Parquet footers, JSON lines).
Read only, but for `drop_job` with `apply` (a retired job's bookkeeping removed): nothing else
here creates, moves or removes a file."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from durable_sinks.core.durable_fs import remove_tree
from durable_sinks.core.errors import CorruptRecordError
from durable_sinks.core.naming import ParticipantName, component
from durable_sinks.core.operations import Bookkeeping, Holding, Prepared
from durable_sinks.core.protocol import OpenContext

from .encoders import Encoder
from .layout import MARKER, NEWEST, PROBE, Layout, read_marker
from .recovery import owned_staging


def in_doubt(layout: Layout, context: OpenContext) -> list[Prepared]:
    """Every prepared staging folder of the job and sink, of any generation."""
    now = time.time()
    found = []
    for _, folder in owned_staging(layout, context):
        try:
            handle = read_marker(folder)
            age = now - (folder / MARKER).stat().st_mtime
            size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        except FileNotFoundError:
            continue  # committed or rolled back while it was read
        if handle is None:
            continue  # being written, or abandoned unprepared: recovery removes it
        found.append(Prepared(handle, f"staging folder {folder}", age, size))
    return found


def holdings(layout: Layout, encoder: Encoder, first: int, last: int) -> dict[int, Holding]:
    """Per epoch in `first..last` with a published folder: its parts' markers, and the rows
    of their data files (a part without a marker, or whose marker records another count, is a
    problem named in the holding)."""
    found = {}
    for epoch, folder in sorted(layout.epochs()):
        if not first <= epoch <= last:
            continue
        participants, problems, rows, at = set(), [], 0, None
        for part in sorted(folder.glob("part=*")):
            counted = sum(encoder.count_rows(f) for f in encoder.data_files(part))
            rows += counted
            marker = read_marker(part)
            if marker is None:
                problems.append(f"{part} holds {counted} rows but no marker ({MARKER})")
                continue
            participants.add(marker.participant)
            at = max(at or 0.0, (part / MARKER).stat().st_mtime)
            if marker.rows != counted:
                problems.append(f"{part} holds {counted} rows, its marker {marker.rows}")
        found[epoch] = Holding(
            epoch,
            marker=bool(participants),
            participants=frozenset(participants),
            rows=rows,
            counted=True,
            at=at,
            problems=tuple(problems),
        )
    return found


K = TypeVar("K")

#: Why the epoch markers stay unless asked for.
MARKERS_KEPT = (
    "the markers say which part folders are whole (committed_dataset, durable-sinks verify "
    "read them; Spark, pyarrow and DuckDB skip them): give --epoch-markers to remove them too"
)


def drop_job(
    layout: Layout, context: OpenContext, *, apply: bool, epoch_markers: bool
) -> list[Bookkeeping]:
    """The job's bookkeeping in the folder: its unprepared staging folders and start-up
    probe files under `_staging/` (then `_staging/` itself once empty), and the `_EPOCH.json`
    markers of its published parts with the newest-epoch pointer `_newest/` that points at
    them (removed only with `epoch_markers`). Data files are never
    touched. Every path removed was listed in the sink's folder, is no symbolic link, and
    names this job and sink (a staging folder or probe by its name, a marker by the
    participant it records); a prepared staging folder is listed as kept (resolve it)."""
    found: list[Bookkeeping] = []
    area = layout.staging_area
    leftovers: list[Path] = []
    prepared: list[Path] = []
    for _, folder in _real(owned_staging(layout, context), area):
        (prepared if (folder / MARKER).is_file() else leftovers).append(folder)
    probe = f"{PROBE}:{component(context.job_id)}:{component(context.sink)}:"
    probes = sorted(p for p in area.glob(f"{_glob_escape(probe)}*") if _inside(p, area))
    if leftovers or probes:
        found.append(Bookkeeping("staging leftovers", str(area), len(leftovers) + len(probes)))
    if prepared:
        why = "prepared participants: run durable-sinks resolve first"
        found.append(Bookkeeping("prepared staging folders", str(area), len(prepared), why))
    markers = [
        part / MARKER
        for _, part in _real(
            ((e, p) for e, folder in layout.epochs() for p in folder.glob("part=*")),
            layout.root,
        )
        if _owned_marker(part, context)
    ]
    if markers:
        kept = None if epoch_markers else MARKERS_KEPT
        found.append(Bookkeeping("epoch markers _EPOCH.json", str(layout.root), len(markers), kept))
    pointer = layout.newest_area
    entries = layout.announced() if markers and _inside(pointer, layout.root) else []
    if entries:
        # Only beside the job's markers (the folder is one sink's): it points at them.
        kept = None if epoch_markers else "it points at the epoch markers, which stay"
        found.append(
            Bookkeeping(f"newest-epoch pointer {NEWEST}/", str(pointer), len(entries), kept)
        )
    if apply:
        for path in [*leftovers, *probes]:
            remove_tree(path)
        if epoch_markers:
            for marker in markers:
                marker.unlink(missing_ok=True)
            if entries:
                remove_tree(pointer)
        if area.is_dir() and not area.is_symlink() and not any(area.iterdir()):
            area.rmdir()
    return found


def _inside(path: Path, folder: Path) -> bool:
    """Whether `path` is an entry of `folder` itself, and no symbolic link."""
    return path.parent == folder and not path.is_symlink()


def _real(entries: Iterable[tuple[K, Path]], folder: Path) -> list[tuple[K, Path]]:
    """The (key, path) pairs whose path lies under `folder` without symbolic links."""
    found = []
    root = folder.resolve()
    for key, path in entries:
        if path.is_symlink() or not path.is_dir():
            continue
        if path.resolve().is_relative_to(root):
            found.append((key, path))
    return found


def _owned_marker(part: Path, context: OpenContext) -> bool:
    """Whether `part`'s marker records a participant of this job and sink."""
    if (part / MARKER).is_symlink():
        return False
    try:
        handle = read_marker(part)
    except CorruptRecordError:
        return False  # not ours to judge: verify names it
    if handle is None:
        return False
    name = ParticipantName.parse(handle.participant)
    return name is not None and name.owned_by(context.job_id, context.sink)


def _glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)
