"""What a sink's start needs of a Delta table, read from the log without loading the table:
the newest version, the job's committed epoch (its application transaction's version), the
table's shape, protocol and properties.

Loading a table (delta-rs's `DeltaTable`) replays the last checkpoint, which lists every file
of the table, plus every commit after it: a start would grow with the table. This reads the
`_delta_log/_last_checkpoint` hint, the commits after that checkpoint (versions are
consecutive: read one by one until the first that does not exist, at most the checkpoint
interval's worth, 100 with delta-rs; on an object store 16 requests at a time), newest first,
and for what they do not say the checkpoint's `txn`, `metaData` or `protocol` columns only
(one row each of a few actions; the file list's columns are not read). Without a hint the log
is read from version 0.

A log this cannot read so (a multi-part or V2 checkpoint, no version 0 and no hint, an action
it cannot parse) is loaded by delta-rs instead (`None` from `read_snapshot`): the answer is the
same, only slower. A hint that lags a newer checkpoint is read as the log's newest version
when the commits between were cleaned up: the sink's reread of its committed epoch (asked
when the open's answer looks short of the job's decisions) loads the table instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from durable_sinks.core.threads import process_pool

from .shape import Shape
from .storage import TableStorage

if TYPE_CHECKING:
    from deltalake import DeltaTable

LOG = "_delta_log"
CHECKPOINT_HINT = f"{LOG}/_last_checkpoint"
#: Commits read at once from an object store (on a local disk: one after another).
OBJECT_STORE_READS = 16
#: The actions a start reads, as their keys appear in a commit's lines.
WANTED = (b'"txn"', b'"metaData"', b'"protocol"')
#: The most commits after the last checkpoint read before the table is loaded instead (a
#: writer that checkpoints rarely, or not at all).
MOST_COMMITS = 1000


@dataclass(frozen=True)
class LogSnapshot:
    """The table at `version`, as far as a start needs it."""

    version: int
    committed_epoch: int | None
    shape: Shape
    min_reader_version: int
    min_writer_version: int
    configuration: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, table: DeltaTable, app_id: str) -> LogSnapshot:
        """The same, from a loaded table."""
        import pyarrow as pa

        committed = table.transaction_version(app_id)
        protocol = table.protocol()
        metadata = table.metadata()
        return cls(
            version=int(table.version()),
            committed_epoch=None if committed is None else int(committed),
            shape=Shape(pa.schema(table.schema().to_arrow()), tuple(metadata.partition_columns)),
            min_reader_version=int(protocol.min_reader_version),
            min_writer_version=int(protocol.min_writer_version),
            configuration=dict(metadata.configuration),
        )


def _commit(version: int) -> str:
    return f"{LOG}/{version:020d}.json"


class _Found:
    """The newest of each action a start needs, filled newest commit first."""

    def __init__(self, app_id: str) -> None:
        self.app_id = app_id
        self.txn: int | None = None
        self.txn_seen = False
        self.metadata: dict[str, Any] | None = None
        self.protocol: dict[str, Any] | None = None

    def missing(self) -> list[bytes]:
        """The keys (as a commit's lines spell them) of the actions still to find."""
        found = (self.txn_seen, self.metadata is not None, self.protocol is not None)
        return [key for key, done in zip(WANTED, found, strict=True) if not done]

    @property
    def complete(self) -> bool:
        return not self.missing()

    def take(self, action: dict[str, Any]) -> None:
        txn = action.get("txn")
        if txn is not None and not self.txn_seen and txn.get("appId") == self.app_id:
            self.txn, self.txn_seen = int(txn["version"]), True
        if action.get("metaData") is not None and self.metadata is None:
            self.metadata = action["metaData"]
        if action.get("protocol") is not None and self.protocol is None:
            self.protocol = action["protocol"]


def read_snapshot(
    storage: TableStorage, app_id: str, since: LogSnapshot | None = None
) -> LogSnapshot | None:
    """The table's snapshot from its log's tail (module docstring); None when the log must
    be loaded by delta-rs instead (also when there is no table: the load says so). `since`:
    a snapshot read before, brought up to date with the commits after it (when its version
    is still in the log: not when the table was deleted or replaced)."""
    if since is not None and storage.exists(_commit(since.version)):
        return _caught_up(storage, app_id, since)
    start = 0
    checkpoint: int | None = None
    hint = storage.read_bytes(CHECKPOINT_HINT)
    if hint is not None:
        try:
            found = json.loads(hint)
        except ValueError:
            return None
        if not isinstance(found, dict) or "parts" in found or "v2Checkpoint" in found:
            return None
        checkpoint = int(found["version"])
        start = checkpoint + 1
    commits = _commits_from(storage, start)
    if commits is None or (checkpoint is None and not commits):
        return None  # no table here, a log without version 0 and no hint, or a long tail
    version = start + len(commits) - 1
    wanted = _Found(app_id)
    _scan(commits, wanted)
    read = wanted.complete or checkpoint is None or _from_checkpoint(storage, checkpoint, wanted)
    return _snapshot(version, wanted) if read else None


def _caught_up(storage: TableStorage, app_id: str, since: LogSnapshot) -> LogSnapshot | None:
    """`since` with the commits written after it applied (itself when there are none)."""
    commits = _commits_from(storage, since.version + 1)
    if commits is None:
        return None
    if not commits:
        return since
    wanted = _Found(app_id)
    _scan(commits, wanted)
    if not wanted.txn_seen:
        wanted.txn, wanted.txn_seen = since.committed_epoch, True
    return _snapshot(since.version + len(commits), wanted, since)


def _commits_from(storage: TableStorage, start: int) -> list[bytes] | None:
    """The commits from version `start` on, up to the first that does not exist; None when
    there are more than MOST_COMMITS."""
    batch = OBJECT_STORE_READS if storage.config.on_s3 else 1
    commits: list[bytes] = []
    while len(commits) <= MOST_COMMITS:
        first = start + len(commits)
        if batch == 1:  # a local file, read directly (a fifth of a pyarrow stream's cost)
            read = [_local_bytes(storage.full_path(_commit(first)))]
        else:  # a round trip each: `batch` at once
            pool = process_pool("durable-sinks-delta-log", OBJECT_STORE_READS)
            read = list(
                pool.map(storage.read_bytes, [_commit(v) for v in range(first, first + batch)])
            )
        for data in read:
            if data is None:
                return commits
            commits.append(data)
    return None


def _local_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        return None


def _scan(commits: list[bytes], wanted: _Found) -> None:
    """Fill `wanted` from `commits` (oldest first), newest first."""
    for data in reversed(commits):
        keys = wanted.missing()
        if not keys:
            return
        if not any(key in data for key in keys):
            continue  # the commit has none of them (its add and commitInfo left unparsed)
        for line in data.splitlines():
            if any(key in line for key in keys):
                wanted.take(json.loads(line))


def _from_checkpoint(storage: TableStorage, version: int, wanted: _Found) -> bool:
    """Fill `wanted` from the single-file checkpoint of `version` (only the columns of the
    actions it still lacks, of `txn`, `metaData` and `protocol`); False when there is no
    such file."""
    import pyarrow.parquet as pq

    path = storage.full_path(f"{LOG}/{version:020d}.checkpoint.parquet")
    try:
        columns = [key.decode().strip('"') for key in wanted.missing()]
        with storage.filesystem().open_input_file(path) as file:
            table = pq.ParquetFile(file).read(columns=columns)
    except FileNotFoundError:
        return False
    for name in columns:
        for row in table.column(name).drop_null().to_pylist():
            if name == "metaData":
                row = {**row, "configuration": dict(row.get("configuration") or [])}
            wanted.take({name: row})
    return True


def _snapshot(version: int, wanted: _Found, since: LogSnapshot | None = None) -> LogSnapshot | None:
    """The snapshot of `wanted`'s actions; what they lack taken from `since` (None when
    there is no such snapshot and they lack something)."""
    import pyarrow as pa
    from deltalake import Schema

    metadata, protocol = wanted.metadata, wanted.protocol
    if since is None and (metadata is None or protocol is None):
        return None
    if metadata is None:
        assert since is not None
        shape, configuration = since.shape, since.configuration
    else:
        schema = pa.schema(Schema.from_json(metadata["schemaString"]).to_arrow())
        shape = Shape(schema, tuple(metadata.get("partitionColumns") or ()))
        configuration = dict(metadata.get("configuration") or {})
    if protocol is None:
        assert since is not None
        reader, writer = since.min_reader_version, since.min_writer_version
    else:
        reader, writer = int(protocol["minReaderVersion"]), int(protocol["minWriterVersion"])
    return LogSnapshot(
        version=version,
        committed_epoch=wanted.txn,
        shape=shape,
        min_reader_version=reader,
        min_writer_version=writer,
        configuration=configuration,
    )
