"""The Delta log as the sink uses it, through delta-rs: the table's shape, the job's
committed epoch (its application transaction's version), and the one commit per epoch.

An epoch's commit carries `txn(appId=<job and sink>, version=<epoch>)`, so the table itself
records which epochs are in it: a commit whose version is already recorded is not made again,
and two writers racing to commit one epoch are told apart by Delta's own conflict rule
(concurrent transactions of one appId: the loser fails, then finds the epoch recorded).
Conflicts with other writers (appends, compactions) are retried by delta-rs per Delta's rules.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from durable_sinks.core.joblog import JobLogger

from .layout import COMMIT_INFO, COMMIT_VERSION_KEY
from .shape import Shape, adds_columns, normalised_schema
from .snapshot import CHECKPOINT_HINT, LogSnapshot, read_snapshot
from .storage import TableStorage

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable


#: How often a commit that lost to a concurrent commit of the same appId is looked at again.
CONCURRENT_CHECKS = 3


class DeltaLog:
    """One table's log, loaded afresh for each question (another writer may have moved it);
    the epoch's commit starts from the table this log committed to last, brought up to date
    (`latest`)."""

    def __init__(
        self, storage: TableStorage, app_id: str, commit_retries: int, log: JobLogger
    ) -> None:
        self.storage = storage
        self._log = log
        self.app_id = app_id
        self.commit_retries = commit_retries
        self._latest: DeltaTable | None = None
        self._snapshot: LogSnapshot | None = None

    def latest(self) -> DeltaTable | None:
        """The table at its newest version, as `load` gives it, but read incrementally: the
        table the last commit started from, with the log versions written since then (by this
        sink or any other writer) applied, instead of the whole log since its last checkpoint
        (which grows by one version per epoch until the next checkpoint: about 2 ms at 10
        versions, 18-32 ms at 98, against 1-4 ms to catch up). Loaded afresh when there is no
        such table yet, when catching up fails, or when the version it is at is no longer in
        the log (the table was deleted or replaced)."""
        table = self._latest
        if table is not None:
            try:
                table.update_incremental()
                if self.storage.exists(f"_delta_log/{table.version():020d}.json"):
                    return table
            except Exception as exc:  # noqa: BLE001 - any failure: read the log afresh
                self._log.debug(
                    "catching up with the Delta log failed (%s): loading it afresh", exc
                )
        self._latest = table = self.load()
        return table

    def load(self) -> DeltaTable | None:
        """The table at its newest version, or None when there is none at the path."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(
                self.storage.table_uri, storage_options=self.storage.storage_options()
            )
        except TableNotFoundError:
            return None

    def snapshot(self) -> LogSnapshot | None:
        """What a start needs of the table (snapshot.py), read from the log's tail without
        loading the table's file list; None when there is no table. The next call reads
        only the commits made since. A log the tail cannot answer for is loaded (and kept
        for the first commit, as `latest` keeps it)."""
        try:
            found = read_snapshot(self.storage, self.app_id, self._snapshot)
        except (ValueError, KeyError, TypeError) as exc:
            self._log.debug("reading the Delta log's tail failed (%s): loading the table", exc)
            found = None
        if found is None:
            table = self.latest()
            found = None if table is None else LogSnapshot.of(table, self.app_id)
        self._snapshot = found
        return found

    def reach(self) -> None:
        """Read the log's checkpoint hint (any storage failure raises): the log can be read."""
        self.storage.read_bytes(CHECKPOINT_HINT)

    def committed_epoch(self, table: DeltaTable | None = None) -> int | None:
        table = table if table is not None else self.load()
        if table is None:
            return None
        version = table.transaction_version(self.app_id)
        return None if version is None else int(version)

    @staticmethod
    def shape(table: DeltaTable) -> Shape:
        import pyarrow as pa

        schema = pa.schema(table.schema().to_arrow())
        return Shape(schema, tuple(table.metadata().partition_columns))

    def referenced(self, table: DeltaTable) -> set[str]:
        """Paths (relative, as the log holds them) of the table's current files."""
        actions = table.get_add_actions(flatten=False)
        import pyarrow as pa

        return {str(p) for p in pa.table(actions).column("path").to_pylist()}

    # -- the epoch's commit --------------------------------------------------------------------
    def _properties(self, epoch: int, participants: Sequence[str]) -> Any:
        from deltalake import CommitProperties, Transaction

        return CommitProperties(
            app_transactions=[Transaction(self.app_id, epoch)],
            custom_metadata={
                "durable_sinks.epoch": str(epoch),
                "durable_sinks.participants": json.dumps(sorted(participants)),
                COMMIT_VERSION_KEY: str(COMMIT_INFO.current),
            },
            max_commit_retries=self.commit_retries,
        )

    def append(
        self,
        epoch: int,
        files: Sequence[dict[str, Any]],
        shape: Shape,
        participants: Sequence[str],
        create: bool,
    ) -> bool:
        """Commit `files` as epoch `epoch`'s one commit (creating the table with them when it
        does not exist and `create`). False when the epoch was already recorded."""
        from deltalake import Schema
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

        adds: list[AddAction | RemoveAction] = [
            AddAction(
                str(f["path"]),
                int(f["size"]),
                dict(f["partition_values"]),
                int(f["modification_time"]),
                True,
                str(f["stats"]),
            )
            for f in files
        ]
        for _ in range(CONCURRENT_CHECKS):
            table = self.latest()
            if table is None:
                if not create:
                    raise FileNotFoundError(f"no Delta table at {self.storage.where}")
                try:
                    create_table_with_add_actions(
                        self.storage.table_uri,
                        Schema.from_arrow(shape.schema),
                        [a for a in adds if isinstance(a, AddAction)],
                        mode="error",
                        partition_by=list(shape.partition_by) or None,
                        storage_options=self.storage.storage_options(),
                        commit_properties=self._properties(epoch, participants),
                    )
                except Exception as exc:
                    if "already exists" not in str(exc):
                        raise
                    continue  # another writer created it first: append to theirs
                return True
            if _recorded(self.committed_epoch(table), epoch):
                return False
            try:
                table.create_write_transaction(
                    adds,
                    mode="append",
                    schema=table.schema(),
                    partition_by=list(shape.partition_by) or None,
                    commit_properties=self._properties(epoch, participants),
                )
            except CommitFailedError as exc:
                if "Concurrent transaction" not in str(exc):
                    raise
                continue  # someone committed this appId meanwhile: look again
            return True
        raise RuntimeError(f"epoch {epoch}'s commit kept racing another commit of its appId")

    def append_rows(
        self, epoch: int, rows: pa.Table, shape: Shape, participants: Sequence[str]
    ) -> bool:
        """Append `rows` as epoch `epoch`'s one commit, adding the columns of `shape` the
        table lacks: delta-rs writes the rows' files and commits them with a metaData action
        carrying the wider schema and the epoch's application transaction, all in one log
        version. False when the epoch was already recorded."""
        from deltalake import write_deltalake
        from deltalake.exceptions import CommitFailedError

        for _ in range(CONCURRENT_CHECKS):
            table = self.load()
            if table is None:
                raise FileNotFoundError(f"no Delta table at {self.storage.where}")
            if _recorded(self.committed_epoch(table), epoch):
                return False
            try:
                write_deltalake(
                    table,
                    rows.cast(normalised_schema(shape.schema)),
                    mode="append",
                    schema_mode="merge",
                    partition_by=list(shape.partition_by) or None,
                    commit_properties=self._properties(epoch, participants),
                )
            except CommitFailedError as exc:
                if "Concurrent transaction" not in str(exc):
                    raise
                continue
            return True
        raise RuntimeError(f"epoch {epoch}'s commit kept racing another commit of its appId")

    def merge(
        self,
        epoch: int,
        rows: pa.Table,
        key: Sequence[str],
        shape: Shape,
        participants: Sequence[str],
        create: bool,
    ) -> bool:
        """Upsert `rows` by `key` as epoch `epoch`'s one commit (MERGE: matched rows updated,
        others inserted; a missing table created with them when `create`). False when the
        epoch was already recorded."""
        from deltalake import write_deltalake
        from deltalake.exceptions import CommitFailedError

        for _ in range(CONCURRENT_CHECKS):
            table = self.load()
            if table is None and not create:
                raise FileNotFoundError(f"no Delta table at {self.storage.where}")
            try:
                if table is None:
                    write_deltalake(
                        self.storage.table_uri,
                        rows.cast(normalised_schema(shape.schema)),
                        mode="error",
                        partition_by=list(shape.partition_by) or None,
                        storage_options=self.storage.storage_options(),
                        commit_properties=self._properties(epoch, participants),
                    )
                    return True
                if _recorded(self.committed_epoch(table), epoch):
                    return False
                predicate = " AND ".join(f"t.`{k}` = s.`{k}`" for k in key)
                (
                    table.merge(
                        rows,
                        predicate,
                        source_alias="s",
                        target_alias="t",
                        # New columns (schema evolution) join the table's schema in this
                        # commit's metaData action.
                        merge_schema=adds_columns(self.shape(table).schema, shape),
                        commit_properties=self._properties(epoch, participants),
                    )
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .execute()
                )
            except CommitFailedError as exc:
                if "Concurrent transaction" not in str(exc):
                    raise
                continue
            except Exception as exc:
                if table is None and "already exists" in str(exc):
                    continue
                raise
            return True
        raise RuntimeError(f"epoch {epoch}'s commit kept racing another commit of its appId")


def _recorded(committed: int | None, epoch: int) -> bool:
    return committed is not None and committed >= epoch
