"""What `durable-sinks` reads of a Delta sink (core/operations.py): the participants whose
journals are on the table (prepared or half-written), and per epoch the commit that carries it
(its participants, rows and time, from the commit info). Read only."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.operations import Holding, Prepared

from .handles import journal_handle, journal_paths, leftover, paths_of
from .layout import COMMIT_INFO, COMMIT_VERSION_KEY

if TYPE_CHECKING:
    from deltalake import DeltaTable


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
