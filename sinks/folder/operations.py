"""What the `durable-sinks` command shows of a folder sink (core/operations.py): the job's
prepared participants, and per epoch the published parts, their markers and their rows
counted on the data files themselves (the encoder reads them: Parquet footers, JSON lines).
Read only: nothing here creates, moves or removes a file."""

from __future__ import annotations

import time

from durable_sinks.core.operations import Holding, Prepared
from durable_sinks.core.protocol import OpenContext

from .encoders import Encoder
from .layout import MARKER, Layout, read_marker
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
