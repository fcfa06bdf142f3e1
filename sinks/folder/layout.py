"""Where a folder sink keeps what, under its folder (both kinds; the data files' names are
the encoder's, encoders.py)::

    _staging/<participant>/<data files>         phase 1: the rows, written and fsynced
    _staging/<participant>/_EPOCH.json          phase 1's last step: the handle (= prepared)
    epoch=<epoch>/part=<part>/<data files>      phase 2: the staging folder, renamed here
    epoch=<epoch>/part=<part>/_EPOCH.json       the epoch marker, published with the rows

The data files are `part-00000.parquet` (then `part-00001.parquet`, ... when the schema
evolves mid-epoch) for `files`, `rows.jsonl` for `jsonl`. Readers read
`epoch=*/part=*/<data files>` as a Hive-partitioned dataset and never look into `_staging`
(Spark, pyarrow and DuckDB skip folders starting with `_`). The marker is the participant's
CommitHandle; it moves with the rows in one atomic rename, so a reader that sees the rows
sees the marker and the other way round, and the last committed epoch is read from the
published markers.

Every name in `_staging` is a participant name (core/naming.py: job, sink, epoch, part,
generation, attempt): recovery finds what belongs to its job and sink by name alone. The
start-up probe's files are `_staging/.probe:<job>:<sink>:<generation>`.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from durable_sinks.core.protocol import CommitHandle

STAGING = "_staging"
MARKER = "_EPOCH.json"
#: Names of the start-up probe's files in `_staging`: `.probe:<job>:<sink>:<generation>`.
PROBE = ".probe"


@dataclass(frozen=True)
class Layout:
    """The paths of one sink's folder."""

    root: Path

    @property
    def staging_area(self) -> Path:
        return self.root / STAGING

    def staging(self, participant: str) -> Path:
        """The staging folder of one participant (its stored name)."""
        return self.staging_area / participant

    def published(self, epoch: int, part: str) -> Path:
        """Where a committed participant of `epoch` and `part` lives."""
        return self.root / f"epoch={epoch}" / f"part={part}"

    def epochs(self) -> Iterator[tuple[int, Path]]:
        """Every published epoch's folder, with its epoch (in no particular order)."""
        for folder in self.root.glob("epoch=*"):
            text = folder.name.partition("=")[2]
            if text.isdigit():
                yield int(text), folder

    def epochs_newest_first(self) -> Iterator[tuple[int, Path]]:
        """Every published epoch's folder, newest first, from one read of the folder's
        names (no file opened, and no path built or order taken but for the epochs the
        caller reaches: a heap)."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return
        found = [(-int(n[6:]), n) for n in names if n.startswith("epoch=") and n[6:].isdigit()]
        heapq.heapify(found)
        while found:
            negative, name = heapq.heappop(found)
            yield -negative, self.root / name

    def committed_parts(self, epochs: range | None = None) -> list[Path]:
        """The published part folders holding a marker (whole, by the one rename that
        published them), of `epochs` if given, in epoch and part order."""
        parts = [
            (epoch, part)
            for epoch, folder in self.epochs()
            if epochs is None or epoch in epochs
            for part in folder.glob("part=*")
            if (part / MARKER).is_file()
        ]
        return [part for _, part in sorted(parts)]


def read_marker(folder: Path) -> CommitHandle | None:
    """The handle in `folder`'s marker, or None when it has none; CorruptRecordError naming
    the file when the marker is not a handle."""
    try:
        data = (folder / MARKER).read_bytes()
    except FileNotFoundError:
        return None
    return CommitHandle.loads(data, source=str(folder / MARKER))
