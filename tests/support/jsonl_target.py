"""A JSON Lines folder as the conformance suite's target, read as its readers read it:
published `rows.jsonl` files only. The connector is built by kind through the registry, so
the same target serves the built-in `jsonl` kind and the `ledger` plugin kind."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from durable_sinks import sinks
from durable_sinks.core import SinkConnector
from durable_sinks.sinks.folder import ROWS, STAGING, FolderSink, Jsonl
from durable_sinks.testing import COLUMNS, BadRows, Row


class JsonlTarget:
    """`sink_class` (a FolderSink subclass) replaces the registry's kind; `columns` are what
    `committed_rows` reads (DEAD_LETTER_COLUMNS for a dead-letter target); `bad_rows` says
    what the sink refuses (durable_sinks.testing.BadRows)."""

    def __init__(
        self,
        path: Path,
        name: str = "jsonl",
        kind: str = "jsonl",
        *,
        sink_class: type[FolderSink] | None = None,
        columns: Sequence[str] = COLUMNS,
        bad_rows: BadRows | None = None,
    ) -> None:
        self.path = path
        self.name = name
        self.kind = kind
        self.sink_class = sink_class
        self.columns = tuple(columns)
        self.bad_rows = bad_rows
        self._cache: dict[tuple[str, int, int], list[Row]] = {}

    def connector(self) -> SinkConnector:
        if self.sink_class is not None:
            return self.sink_class(Jsonl(str(self.path), name=self.name))
        folder = "folder" if self.kind == "ledger" else "path"
        return sinks.create(self.kind, {folder: str(self.path), "name": self.name})

    def committed_rows(self) -> list[Row]:
        rows: list[Row] = []
        for file in sorted(self.path.glob(f"epoch=*/part=*/{ROWS}")):
            stat = file.stat()
            key = (str(file), stat.st_ino, stat.st_size)
            if key not in self._cache:  # published files never change: read each once
                self._cache[key] = [
                    tuple(json.loads(line)[c] for c in self.columns)
                    for line in file.read_text().splitlines()
                ]
            rows.extend(self._cache[key])
        return rows

    def leftovers(self) -> list[str]:
        staging = self.path / STAGING
        return sorted(p.name for p in staging.iterdir()) if staging.exists() else []
