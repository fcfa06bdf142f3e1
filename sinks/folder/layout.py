"""Where a folder sink keeps what, under its folder (both kinds; the data files' names are
the encoder's, encoders.py)::

    _staging/<participant>/<data files>         phase 1: the rows, written and fsynced
    _staging/<participant>/_EPOCH.json          phase 1's last step: the handle (= prepared)
    epoch=<epoch>/part=<part>/<data files>      phase 2: the staging folder, renamed here
    epoch=<epoch>/part=<part>/_EPOCH.json       the epoch marker, published with the rows
    _newest/<epoch>                             the newest-epoch pointer: an empty file per
                                                epoch announced for publishing, the newest
                                                ones only

The data files are `part-00000.parquet` (then `part-00001.parquet`, ... when the schema
evolves mid-epoch) for `files`, `rows.jsonl` for `jsonl`. Readers read
`epoch=*/part=*/<data files>` as a Hive-partitioned dataset and never look into `_staging`
(Spark, pyarrow and DuckDB skip folders starting with `_`). The marker is the participant's
CommitHandle; it moves with the rows in one atomic rename, so a reader that sees the rows
sees the marker and the other way round, and the last committed epoch is read from the
published markers.

The newest-epoch pointer lets an open find the newest published epoch without listing the
folder's `epoch=*` names (one per epoch ever published). A publish creates `_newest/<epoch>`
(fsynced) before its rename, and after the rename removes the entries of older epochs; so
the newest published epoch always has its entry (only the publish of a newer epoch removes
it, after that epoch is published), and the newest entry whose epoch folder holds a marker
is the newest published epoch. Entries above it are publishes cut short between the two
steps (their decisions commit them again at recovery). A folder with no entry whose epoch is
published (published before the pointer existed, or every entry cut short) is listed
instead, and the open that listed creates the entry of what it found.

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

from durable_sinks.core.durable_fs import fsync_dir
from durable_sinks.core.protocol import CommitHandle

STAGING = "_staging"
#: The most epochs `committed_parts` opens one by one rather than listing the folder.
DIRECT_EPOCHS = 16
#: The newest-epoch pointer's folder: an empty file named by each epoch announced.
NEWEST = "_newest"
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

    def epoch_folder(self, epoch: int) -> Path:
        """The folder of `epoch`'s published parts."""
        return self.root / f"epoch={epoch}"

    @property
    def newest_area(self) -> Path:
        return self.root / NEWEST

    def announce(self, epoch: int, *, fsync: bool) -> None:
        """Create the pointer entry of `epoch` (before publishing any part of it): durable
        before this returns when `fsync`. Idempotent."""
        area = self.newest_area
        try:
            area.mkdir()
        except FileExistsError:
            pass
        else:
            if fsync:
                fsync_dir(self.root)
        os.close(os.open(area / str(epoch), os.O_CREAT | os.O_WRONLY, 0o644))
        if fsync:
            fsync_dir(area)

    def retire_below(self, epoch: int) -> None:
        """Remove the pointer entries of epochs below `epoch` (after `epoch` is published:
        its entry now stands for them). Not fsynced: an entry that comes back after a crash
        is an older epoch, which an open skips or checks."""
        for found in self.announced():
            if found < epoch:
                (self.newest_area / str(found)).unlink(missing_ok=True)

    def announced(self) -> list[int]:
        """The epochs with a pointer entry, newest first (none when there is no pointer)."""
        try:
            names = os.listdir(self.newest_area)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted((int(n) for n in names if n.isdigit()), reverse=True)

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
        published them), of `epochs` if given, in epoch and part order (a range of fewer
        epochs than the folder holds opens their folders without listing the folder)."""
        if epochs is not None and epochs.step == 1 and len(epochs) <= DIRECT_EPOCHS:
            return [
                part
                for epoch in epochs
                for part in sorted(_parts(self.epoch_folder(epoch)))
                if (part / MARKER).is_file()
            ]
        parts = [
            (epoch, part)
            for epoch, folder in self.epochs()
            if epochs is None or epoch in epochs
            for part in folder.glob("part=*")
            if (part / MARKER).is_file()
        ]
        return [part for _, part in sorted(parts)]


def _parts(folder: Path) -> list[Path]:
    """The `part=*` folders of one epoch folder (none when it is missing)."""
    try:
        return [folder / n for n in os.listdir(folder) if n.startswith("part=")]
    except (FileNotFoundError, NotADirectoryError):
        return []


def read_marker(folder: Path) -> CommitHandle | None:
    """The handle in `folder`'s marker, or None when it has none; CorruptRecordError naming
    the file when the marker is not a handle."""
    try:
        data = (folder / MARKER).read_bytes()
    except FileNotFoundError:
        return None
    return CommitHandle.loads(data, source=str(folder / MARKER))
