"""The epoch journal: one small JSON object per participant, under a folder of its epoch, so
that the driver finds an epoch's participants (the losing task attempts among them) by
listing that folder alone, and a start finds the participants left prepared by listing the
sink's journal, whatever the size of the table.

    <data folder>/_durable-sinks/<job>/<sink>/<epoch>/<generation>-<attempt>-<part>.parquet

An entry is JSON, kept as the one value of a one-row Parquet file: stores that keep Iceberg
tables only (S3 table buckets) accept Parquet files under a table's data folder and refuse
other objects there.

Every participant writes its entry before its first data file (`{"participant": ...}`: it
may write files from now on); a task writes it again with its handle at `pre_commit` (the
driver's handle is in the epoch's decision record). The epoch's commit deletes the entries
of the participants it committed; a rollback deletes the participant's entry after its
files. An entry without a handle is a participant that stopped before it prepared (or the
driver's): its files are found by their names (layout.py) in the data folder, a listing
that only such an entry costs. An entry written after its epoch was swept (a task attempt
that began or prepared late, or that the commit's batched delete raced with) is found by
the coordinator's second sweep of the epoch, ten epochs later (its `prepared_participants`
is this listing again), and rolled back with its files; one left by a stopped job is found
by the next start's recovery (`all_entries`).

Every entry read back is checked to name a participant of this job's sink and epoch, and its
handle's files to be that participant's own (committer.require_own, where they are used):
anyone who can write the table's storage can write entries too.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from durable_sinks.core.formats import stored_format
from durable_sinks.core.naming import ParticipantName, component
from durable_sinks.core.protocol import CommitHandle
from durable_sinks.core.sink_base import SinkBase
from durable_sinks.core.threads import run_concurrently

from . import _pyiceberg
from .config import Iceberg
from .layout import Layout

if TYPE_CHECKING:
    from pyiceberg.table import Table

JOURNAL = stored_format(
    "Iceberg epoch journal entry",
    current=1,
    oldest=1,
    where="the table's data folder, `_durable-sinks/<job>/<sink>/<epoch>/`, one Parquet file "
    'per participant holding one JSON object, with `"version"`',
)
FOLDER = "_durable-sinks"
#: The one column of an entry's Parquet file: the entry as JSON.
COLUMN = "entry"


def sink_folder(data_path: str, layout: Layout) -> str:
    """The folder of every epoch's entries of this job's sink."""
    return f"{data_path.rstrip('/')}/{FOLDER}/{component(layout.job_id)}/{component(layout.sink)}"


def epoch_folder(data_path: str, layout: Layout, epoch: int) -> str:
    """The folder of `epoch`'s entries under the table's data folder `data_path`."""
    return f"{sink_folder(data_path, layout)}/{epoch}"


def entry_path(data_path: str, layout: Layout, name: ParticipantName) -> str:
    return (
        f"{epoch_folder(data_path, layout, name.epoch)}/"
        f"{name.generation}-{name.attempt}-{name.part}.parquet"
    )


def write(
    sink: SinkBase[Iceberg],
    io: Any,
    data_path: str,
    name: ParticipantName,
    handle: CommitHandle | None,
) -> None:
    """Write (or replace) participant `name`'s entry, with its handle once it has one."""
    layout = Layout(sink.context.job_id, sink.name)
    content: dict[str, Any] = {"version": JOURNAL.current, "participant": str(name)}
    if handle is not None:
        content["handle"] = handle.to_json()
    data = _encoded(json.dumps(content, sort_keys=True))
    path = entry_path(data_path, layout, name)
    with (
        sink.translated("write the epoch journal", name.epoch),
        io.new_output(path).create(overwrite=True) as out,
    ):
        out.write(data)


def _encoded(text: str) -> bytes:
    """`text` as a Parquet file of one row of one string column `entry`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({COLUMN: pa.array([text], pa.string())}), sink)
    return bytes(sink.getvalue())


def _decoded(data: bytes) -> str | None:
    """The text of an entry written by `_encoded`, None if it does not read as one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(pa.BufferReader(data))
    except (OSError, ValueError, pa.ArrowException):
        return None
    if rows.column_names != [COLUMN] or rows.num_rows != 1:
        return None
    value = rows.column(0)[0].as_py()
    return value if isinstance(value, str) else None


def delete(
    sink: SinkBase[Iceberg], table: Table, epoch: int, names: Collection[ParticipantName]
) -> None:
    """Delete the entries of participants `names` (of `epoch`) that are there. The epoch's
    folder is listed first and only listed entries are deleted: a delete asks the storage
    about the key first, and some stores (S3 table buckets) refuse to answer for a key that
    does not exist (403, not 404), so a second call must not touch a deleted entry."""
    if not names:
        return
    layout = Layout(sink.context.job_id, sink.name)
    data_path = table.location_provider().data_path
    wanted = {entry_path(data_path, layout, name).rsplit("/", 1)[1] for name in names}
    folder = epoch_folder(data_path, layout, epoch)
    with sink.translated("list the epoch journal", epoch):
        listed = list(_pyiceberg.list_files(table, folder))
    paths = [p for p in listed if p.rsplit("/", 1)[1] in wanted]
    if paths and len(paths) == len(listed):
        # Every entry of the epoch goes (no losing attempt left): the epoch's folder with
        # them, in batched requests rather than a round trip or two each. An emptied folder
        # would stay (a local file system keeps it; pyarrow's S3 file system leaves an empty
        # marker object `<epoch>/` for a folder whose last file it deletes), one more in
        # every later listing of the journal. An entry written after the listing
        # (a task attempt that prepared in those milliseconds) goes with them: its files
        # are left to orphan-file removal.
        with sink.translated("delete the epoch journal", epoch):
            if _pyiceberg.delete_folder(table, folder):
                return
    with sink.translated("delete an epoch journal entry", epoch):
        _pyiceberg.delete_files(table, paths)


def entries(
    sink: SinkBase[Iceberg], table: Table, epoch: int
) -> list[tuple[ParticipantName, CommitHandle | None]]:
    """Every entry of `epoch` of this job's sink: the participant and its handle (None for a
    participant that has not prepared, or the driver's). An entry that does not read, or
    names anyone else's participant, is skipped (a crash while it was written leaves no half
    object on object storage; on a local file system it does not read as Parquet)."""
    layout = Layout(sink.context.job_id, sink.name)
    folder = epoch_folder(table.location_provider().data_path, layout, epoch)
    with sink.translated("list the epoch journal", epoch):
        paths = sorted(_pyiceberg.list_files(table, folder))
    return _read(sink, table, [(epoch, p) for p in paths])


def all_entries(
    sink: SinkBase[Iceberg], table: Table
) -> list[tuple[ParticipantName, CommitHandle | None]]:
    """Every entry of every epoch of this job's sink (one listing of the sink's journal
    folder: what the commits and rollbacks have not deleted yet), read as `entries` reads
    them, each checked to lie in its own epoch's folder."""
    layout = Layout(sink.context.job_id, sink.name)
    folder = sink_folder(table.location_provider().data_path, layout)
    with sink.translated("list the journal"):
        paths = sorted(_pyiceberg.list_files(table, folder))
    placed = []
    for path in paths:
        epoch = path.rsplit("/", 2)[-2] if path.count("/") >= 2 else ""
        if epoch.isdigit():
            placed.append((int(epoch), path))
    return _read(sink, table, placed)


#: Entries read at once (a start after a crash of a wide epoch finds one per task).
READERS = 16


def _read(
    sink: SinkBase[Iceberg], table: Table, paths: list[tuple[int, str]]
) -> list[tuple[ParticipantName, CommitHandle | None]]:
    """The entries at `paths` (each with its epoch), READERS at a time, in their order."""
    wanted = [(epoch, path) for epoch, path in paths if path.endswith(".parquet")]
    calls = [functools.partial(_one, sink, table, epoch, path) for epoch, path in wanted]
    read = run_concurrently(calls, workers=READERS)
    return [entry for entry in read if entry is not None]


def _one(
    sink: SinkBase[Iceberg], table: Table, epoch: int, path: str, _slot: int
) -> tuple[ParticipantName, CommitHandle | None] | None:
    """The entry at `path`, None when it is gone or is not one (`_slot`: the reading
    worker's, unused)."""
    with sink.translated("read the epoch journal", epoch):
        try:
            with table.io.new_input(path).open() as f:
                data = f.read()
        except FileNotFoundError:
            return None  # deleted since the listing
    return _parsed(data, path, sink, epoch)


def _parsed(
    data: bytes, path: str, sink: SinkBase[Iceberg], epoch: int
) -> tuple[ParticipantName, CommitHandle | None] | None:
    text = _decoded(data)
    if text is None:
        return None
    try:
        content = json.loads(text)
    except ValueError:
        return None
    if not isinstance(content, Mapping):
        return None
    JOURNAL.check(content.get("version"), source=path, job=sink.context.job_id, sink=sink.name)
    name = ParticipantName.parse(str(content.get("participant", "")))
    if name is None or not name.owned_by(sink.context.job_id, sink.name) or name.epoch != epoch:
        return None
    raw = content.get("handle")
    if raw is None:
        return name, None
    handle = CommitHandle.from_json(raw)
    if handle.participant != str(name) or handle.sink != sink.name or handle.epoch != epoch:
        return None
    return name, handle
