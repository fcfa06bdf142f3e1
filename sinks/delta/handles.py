"""What a Delta participant's handle and journal hold: its files (`add` actions), the
journal's state, the table's shape a participant recorded before the table existed, and one
row per key for a MERGE. The handle's details are typed and versioned (core/handles.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durable_sinks.core.handles import HandleDetails
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle

from .shape import Shape, union

if TYPE_CHECKING:
    import pyarrow as pa

WRITING = "writing"
PREPARED = "prepared"


@dataclass(frozen=True)
class DeltaHandleDetails(HandleDetails):
    """A Delta participant's handle details: its files as the `add` actions' fields (a handle
    that only rolls back lists their paths alone), and, for the epoch's commit, the job, the
    mode, and the table shape it wrote (used when the table did not exist yet)."""

    files: tuple[Mapping[str, Any], ...]
    job_id: str = ""
    mode: str = "append"
    partition_by: tuple[str, ...] = ()
    schema: str | None = None


def files_of(handle: CommitHandle) -> list[dict[str, Any]]:
    return [dict(f) for f in DeltaHandleDetails.of(handle).files]


def paths_of(handle: CommitHandle | None) -> list[str]:
    return [] if handle is None else [str(f["path"]) for f in files_of(handle)]


def journal_paths(journal: Mapping[str, Any] | None) -> list[str]:
    if journal is None:
        return []
    handle = journal_handle(journal)
    if handle is not None:
        return paths_of(handle)
    paths = journal.get("paths")
    return [str(p) for p in paths] if isinstance(paths, list) else []


def journal_handle(journal: Mapping[str, Any]) -> CommitHandle | None:
    if journal.get("state") != PREPARED or not isinstance(journal.get("handle"), Mapping):
        return None
    return CommitHandle.from_json(journal["handle"])


def leftover(name: ParticipantName, journal: Mapping[str, Any], sink: str) -> CommitHandle:
    """A handle naming a half-written participant (enough to roll it back)."""
    paths = journal_paths(journal)
    details = DeltaHandleDetails(tuple({"path": p} for p in paths)).to_json()
    return CommitHandle.leftover(sink, name.epoch, str(name), details)


def handle_shapes(handles: Sequence[CommitHandle]) -> list[Shape]:
    """The shape each participant recorded (those that recorded one), in order. The parts of
    one epoch mostly record one schema: each distinct one is parsed once."""
    parsed: dict[tuple[str, tuple[str, ...]], Shape] = {}
    shapes = []
    for handle in handles:
        details = DeltaHandleDetails.of(handle)
        if details.schema is not None:
            key = (details.schema, tuple(details.partition_by))
            if key not in parsed:
                parsed[key] = _parsed_shape(details.schema, key[1])
            shapes.append(parsed[key])
    return shapes


def _parsed_shape(schema: str, partition_by: tuple[str, ...]) -> Shape:
    import pyarrow as pa
    from deltalake import Schema

    return Shape(pa.schema(Schema.from_json(schema).to_arrow()), partition_by)


def handle_shape(handles: Sequence[CommitHandle]) -> Shape | None:
    """The shape the participants recorded, their columns together (a participant may have
    added columns to the table's: schema evolution); None when none recorded one."""
    return union(handle_shapes(handles))


def last_per_key(rows: pa.Table, key: Sequence[str]) -> pa.Table:
    """One row per key, the last one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if rows.num_rows == 0:
        return rows
    numbered = rows.append_column("__ds_row", pa.array(range(rows.num_rows), pa.int64()))
    last = numbered.group_by(list(key), use_threads=False).aggregate([("__ds_row", "max")])
    if last.num_rows == rows.num_rows:
        return rows
    keep = pc.sort_indices(last["__ds_row_max"])
    return rows.take(pc.take(last["__ds_row_max"], keep))
