"""The participants' journals: one small JSON file per participant under the table's
`_durable_sinks` folder (layout.py), written before each of its data files is created (the
paths it has created or is about to create) and rewritten by `pre_commit` with its whole
handle. Recovery, rollback and the operator views read them; the epoch's commit deletes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from durable_sinks.core.formats import stored_format
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.sink_base import SinkBase

from .config import Delta
from .handles import WRITING
from .layout import Layout
from .storage import TableStorage

JOURNAL = stored_format(
    "Delta participant journal",
    current=1,
    oldest=1,
    where='the table\'s `_durable_sinks` folder, one JSON file per participant, with `"version"`',
)


class Journals:
    """The journals of one sink's participants in one table's storage."""

    def __init__(self, sink: SinkBase[Delta], storage: TableStorage, layout: Layout) -> None:
        self._sink, self._storage, self.layout = sink, storage, layout

    def write(self, name: ParticipantName, content: Mapping[str, Any]) -> None:
        journal = {"participant": str(name), **content, "version": JOURNAL.current}
        data = json.dumps(journal, sort_keys=True).encode()
        self._storage.write_bytes(self.layout.journal(name), data)

    def read(self, path: str) -> Mapping[str, Any] | None:
        """The journal at `path`: None when there is none; one cut short by a crash while it
        was written reads as a participant still writing, with no paths."""
        with self._sink.translated("read a journal"):
            data = self._storage.read_bytes(path)
        if data is None:
            return None
        try:
            found = json.loads(data)
        except ValueError:
            return {"state": WRITING, "paths": []}
        if not isinstance(found, dict):
            return None
        JOURNAL.check(found.get("version"), source=path, job=self._sink.context.job_id)
        return found

    def under(self, folder: str) -> list[tuple[ParticipantName, Mapping[str, Any]]]:
        """Every journal under `folder` (the sink's, or one epoch's), by participant."""
        with self._sink.translated("list the journals"):
            listed = self._storage.list(folder)
        found = []
        for item in listed:
            name = self.layout.parse_journal(item.path)
            if name is None:
                continue
            journal = self.read(item.path)
            if journal is not None:
                found.append((name, journal))
        return found

    def remove_emptied(self, up_to: int) -> int:
        """Remove the emptied epoch folders of epochs up to `up_to` (a local table's: an
        epoch's commit deletes its journals and leaves the folder, which would make every
        later listing of the journals longer by one folder per epoch); a folder that still
        holds anything stays. How many were removed."""
        removed = 0
        for relative in self._storage.subfolders(self.layout.folder):
            epoch = self.layout.parse_epoch_folder(relative)
            if epoch is not None and epoch <= up_to:
                removed += self._storage.remove_empty_folder(relative)
        return removed
