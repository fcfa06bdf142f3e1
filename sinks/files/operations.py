"""What `durable-sinks` reads from a files sink's folder (core/operations.py): staging folders
of the job (its prepared participants) and, per epoch, the published part folders, their
markers, and the rows of their Parquet files counted from the files' footers. Read only."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from durable_sinks.core.errors import MALFORMED, CorruptRecordError
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.operations import Holding, Prepared
from durable_sinks.core.protocol import CommitHandle, OpenContext

MARKER = "_EPOCH.json"


def in_doubt(staging: Path, context: OpenContext) -> list[Prepared]:
    """Every staging folder of the job and sink holding a marker (prepared), any generation."""
    found = []
    now = time.time()
    for entry in sorted(staging.iterdir()) if staging.is_dir() else []:
        name = ParticipantName.parse(entry.name)
        if name is None or not name.owned_by(context.job_id, context.sink):
            continue
        try:
            handle = read_handle(entry)
            age = now - (entry / MARKER).stat().st_mtime
        except FileNotFoundError:
            handle = None
        if handle is None:
            continue  # being written, or abandoned unprepared: recovery removes it
        size = sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
        found.append(Prepared(handle, f"staging folder {entry}", age, size))
    return found


def holdings(root: Path, first: int, last: int) -> dict[int, Holding]:
    """Per epoch in `first..last` with a folder: its parts' markers and counted rows."""
    found = {}
    for folder in sorted(root.glob("epoch=*")):
        text = folder.name.partition("=")[2]
        if not text.isdigit() or not first <= int(text) <= last:
            continue
        epoch = int(text)
        participants, problems, rows, at = set(), [], 0, None
        for part in sorted(folder.glob("part=*")):
            counted = sum(pq.read_metadata(f).num_rows for f in sorted(part.glob("*.parquet")))
            rows += counted
            marker = read_marker(part)
            try:
                at = max(at or 0.0, (part / MARKER).stat().st_mtime)
            except FileNotFoundError:
                marker = None
            if marker is None:
                problems.append(f"{part} holds {counted} rows but no marker ({MARKER})")
                continue
            participants.add(str(marker.get("participant")))
            if int(marker.get("rows", -1)) != counted:
                problems.append(
                    f"{part}: its Parquet files hold {counted} rows, its marker "
                    f"{marker.get('rows')}"
                )
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


def read_handle(folder: Path) -> CommitHandle | None:
    """The handle in a staging folder's marker (written at prepare), None when it has none
    (still being written, or abandoned before its prepare); CorruptRecordError naming the
    file when the marker is not a handle."""
    path = folder / MARKER
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return CommitHandle.loads(raw, source=str(path))


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The JSON object of `folder`'s marker, None when it has none; CorruptRecordError naming
    the file when it holds anything else."""
    path = folder / MARKER
    try:
        loaded = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except MALFORMED as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        loaded = exc
    if not isinstance(loaded, dict):
        raise CorruptRecordError(
            f"{path} is not an epoch marker ({type(loaded).__name__})",
            fix="the dataset was changed outside durable-sinks: restore the marker from a "
            "backup, or move the part aside after checking what it holds",
        )
    return loaded
