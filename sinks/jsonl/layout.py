"""Where a JSON Lines sink keeps what, under its folder::

    _staging/<participant>/rows.jsonl           phase 1: the rows, written and fsynced
    _staging/<participant>/_EPOCH.json          phase 1's last step: the handle (= prepared)
    epoch=<epoch>/part=<part>/rows.jsonl        phase 2: the staging folder, renamed here
    epoch=<epoch>/part=<part>/_EPOCH.json       the epoch marker, published with the rows

Readers read `epoch=*/part=*/rows.jsonl` (one JSON object per line, in ASCII) and never look into
`_staging`. The marker is the participant's CommitHandle; it moves with the rows in one atomic
rename, so a reader that sees the rows sees the marker and the other way round, and
`last_committed_epoch` is read from the published markers.

Every name in `_staging` is a participant name (core/naming.py: job, sink, epoch, part,
generation, attempt): recovery finds what belongs to its job and sink by name alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from durable_sinks.core.protocol import CommitHandle

STAGING = "_staging"
ROWS = "rows.jsonl"
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


def read_marker(folder: Path) -> CommitHandle | None:
    """The handle in `folder`'s marker, or None when it has none."""
    try:
        data = (folder / MARKER).read_bytes()
    except FileNotFoundError:
        return None
    return CommitHandle.loads(data, source=str(folder / MARKER))
