"""Phase 1 of one participant: its rows written through the encoder into files in its own
staging folder, then prepared.

Durability: rows written by `write` may be lost in a crash (the files are not yet fsynced) and
are visible to nobody. After `prepare` returns, the data files are fsynced and the marker (the
handle) is created, fsynced, in the same folder: the participant survives any crash and can
be committed or rolled back by any process holding the handle. Nothing is visible to readers
until phase 2 renames the folder.

A newer generation's recovery removes staging folders of older generations that are not
prepared. A writer whose folder vanished has been fenced: its next write or its prepare fails
with FileNotFoundError, which errors.py turns into FencedError; nothing is ever recreated.

Which schema a batch is written in is `fitted`'s: with `schema_evolution="add_columns"` the
sink's schema evolves by each batch (core/evolution.py) for an encoder whose files hold one
schema; otherwise such an encoder refuses a batch of another schema than the first one's. An
encoder whose rows carry their own columns (JSON Lines) takes any batch as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import TYPE_CHECKING, Any

from durable_sinks.core.durable_fs import create_exclusive, fsync_dir, fsync_file, remove_tree
from durable_sinks.core.errors import SchemaMismatchError, UsageError
from durable_sinks.core.evolution import evolved, schema_text
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle, OpenContext, WriteResult
from durable_sinks.core.schemas import schema_difference
from durable_sinks.core.sink_base import OpenParticipant

from .encoders import EncodedFile, Encoder
from .handles import FolderHandleDetails
from .layout import MARKER, Layout

if TYPE_CHECKING:
    import pyarrow as pa


class FolderParticipant(OpenParticipant):
    """The participant one sink instance is writing: created by `begin_epoch` (which creates
    its staging folder), finished by `prepare` (or `discard`)."""

    def __init__(
        self,
        layout: Layout,
        encoder: Encoder,
        context: OpenContext,
        epoch: int,
        name: ParticipantName,
        *,
        fsync: bool,
    ) -> None:
        super().__init__(epoch, name)
        self.layout = layout
        self.encoder = encoder
        self.context = context
        self.fsync = fsync
        self.folder = layout.staging(str(name))
        # A fresh name per attempt: an existing folder is a bug, and mkdir says so.
        self.folder.mkdir()
        self.rows = 0
        self.bytes = 0
        self.digest = hashlib.sha256()
        #: Every data file opened, in order; the last one is being written until `prepare`.
        self.files: list[EncodedFile] = []
        self._open = True

    def write(self, batch: pa.RecordBatch) -> WriteResult:
        """Append `batch` to the current data file, or to the next one when the encoder's
        files hold one schema and the batch's differs."""
        self._require_open()
        # Writes to an open file succeed even once its folder is removed: look first.
        if not self.folder.is_dir():
            raise FileNotFoundError(2, "staging folder removed", str(self.folder))
        current = self.files[-1] if self.files else None
        if current is not None and (
            self.encoder.one_schema_per_file and not current.schema.equals(batch.schema)
        ):
            current.close()  # one schema per file: the next one holds the evolved schema
            current = None
        if current is None:
            path = self.folder / self.encoder.file_name(len(self.files))
            current = self.encoder.open(path, batch.schema)
            self.files.append(current)
        size = current.write(batch, self.digest)
        self.rows += batch.num_rows
        self.bytes += size
        return WriteResult(batch.num_rows, size)

    def prepare(self, sink: str) -> CommitHandle:
        """Make the participant durable and resumable; returns its handle."""
        self._require_open()
        for file in self.files:
            file.close()
            if self.fsync:
                fsync_file(file.path)
        schemas = (
            tuple(schema_text(f.schema) for f in self.files)
            if self.encoder.one_schema_per_file
            else ()
        )
        handle = CommitHandle(
            sink=sink,
            epoch=self.epoch,
            participant=str(self.name),
            rows=self.rows,
            bytes=self.bytes,
            checksum=self.digest.hexdigest(),
            details=FolderHandleDetails(self.context.job_id, self.name.part, schemas).to_json(),
        )
        # The marker is the commit point of phase 1: created only if absent, fsynced.
        create_exclusive(self.folder / MARKER, handle.dumps().encode(), fsync=self.fsync)
        if self.fsync:
            fsync_dir(self.layout.staging_area)
        self._open = False
        return handle

    def discard(self) -> None:
        """Abandon the participant (it never prepared): close and remove its folder, best
        effort; what stays is removed by the next generation's recovery."""
        with contextlib.suppress(OSError):
            self.close()
            remove_tree(self.folder)

    def close(self) -> None:
        """Close its files (a rollback or the sink's close); nothing more can be written."""
        self._open = False
        for file in self.files:
            file.close()

    def _require_open(self) -> None:
        if not self._open:
            raise UsageError(
                f"participant {self.name} is already prepared or closed",
                job=self.context.job_id,
                sink=self.context.sink,
                epoch=self.epoch,
            )


def fitted(
    schema: pa.Schema | None,
    batch: pa.RecordBatch,
    encoder: Encoder,
    *,
    adds_columns: bool,
    where: dict[str, Any],
) -> tuple[pa.Schema, pa.RecordBatch]:
    """The sink's schema after `batch`, and `batch` as it is to be written; a
    SchemaMismatchError, raised before anything of the batch is written, for a batch whose
    schema the encoder's files cannot take (see the module docs)."""
    if not encoder.one_schema_per_file:
        return (batch.schema if schema is None else schema), batch
    if adds_columns:
        return evolved(schema, batch, **where)
    if schema is None or batch.schema.equals(schema):
        return batch.schema, batch
    raise SchemaMismatchError(
        schema_difference(schema, batch.schema),
        **where,
        fix="write batches of one schema to a files sink, give a new path for a new schema, "
        "or let the dataset evolve: durable_sink(..., schema_evolution='add_columns')",
    )
