"""Phase 1 of one participant: its rows appended to a file in its own staging folder, then
prepared.

Durability: rows written by `write` may be lost in a crash (the file is not yet fsynced) and
are visible to nobody. After `prepare` returns, the rows file is fsynced and the marker (the
handle) is created, fsynced, in the same folder: the participant survives any crash and can
be committed or rolled back by any process holding the handle. Nothing is visible to readers
until phase 2 renames the folder.

A newer generation's recovery removes staging folders of older generations that are not
prepared. A writer whose folder vanished has been fenced: it raises FencedError rather than
recreating anything.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import hashlib
import json
import os
from base64 import b64encode
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from durable_sinks.core.durable_fs import create_exclusive, fsync_dir, remove_tree
from durable_sinks.core.errors import FencedError, SchemaMismatchError, UsageError
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle, OpenContext, WriteResult
from durable_sinks.core.sink_base import OpenParticipant

from .handles import JsonlHandleDetails
from .layout import MARKER, ROWS, Layout

if TYPE_CHECKING:
    import pyarrow as pa


class JsonlParticipant(OpenParticipant):
    """The participant one sink instance is writing: created by `begin_epoch`, finished by
    `prepare` (or `discard`)."""

    def __init__(
        self, layout: Layout, context: OpenContext, epoch: int, name: ParticipantName, fsync: bool
    ) -> None:
        super().__init__(epoch, name)
        self.layout = layout
        self.context = context
        self.fsync = fsync
        self.folder = layout.staging(str(name))
        # A fresh name per attempt: an existing folder is a bug, and mkdir says so.
        self.folder.mkdir()
        self.rows = 0
        self.bytes = 0
        self.digest = hashlib.sha256()
        # Kept open across write_batch calls; closed by prepare, discard or close.
        self._file: IO[bytes] | None = open(self.folder / ROWS, "xb")  # noqa: SIM115

    def write(self, batch: pa.RecordBatch) -> WriteResult:
        data = encode_rows(batch, self.context, self.epoch)
        with self._fenced_if_gone():
            # Writes to an open file succeed even once its folder is removed: look first.
            if not self.folder.is_dir():
                raise FileNotFoundError(self.folder)
            self._require_file().write(data)
        self.rows += batch.num_rows
        self.bytes += len(data)
        self.digest.update(data)
        return WriteResult(batch.num_rows, len(data))

    def prepare(self, sink: str) -> CommitHandle:
        """Make the participant durable and resumable; returns its handle."""
        with self._fenced_if_gone():
            file = self._require_file()
            file.flush()
            if self.fsync:
                _fsync(file)
            file.close()
            self._file = None
            handle = CommitHandle(
                sink=sink,
                epoch=self.epoch,
                participant=str(self.name),
                rows=self.rows,
                bytes=self.bytes,
                checksum=self.digest.hexdigest(),
                details=JsonlHandleDetails(self.context.job_id, self.name.part).to_json(),
            )
            # The marker is the commit point of phase 1: created only if absent, fsynced.
            create_exclusive(self.folder / MARKER, handle.dumps().encode(), fsync=self.fsync)
            if self.fsync:
                fsync_dir(self.layout.staging_area)
        return handle

    def discard(self) -> None:
        """Abandon the participant (it never prepared): close and remove its folder, best
        effort; what stays is removed by the next generation's recovery."""
        with contextlib.suppress(OSError):
            self.close()
            remove_tree(self.folder)

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()

    def _require_file(self) -> IO[bytes]:
        if self._file is None:
            raise UsageError(
                f"participant {self.name} is already prepared or closed",
                job=self.context.job_id,
                sink=self.context.sink,
                epoch=self.epoch,
            )
        return self._file

    @contextlib.contextmanager
    def _fenced_if_gone(self) -> Iterator[None]:
        """Turn "my staging folder vanished" into FencedError: only a newer coordinator's
        recovery removes an unprepared staging folder of an older generation."""
        try:
            yield
        except FileNotFoundError as exc:
            if self.folder.exists():
                raise
            raise FencedError(
                f"staging folder {self.folder.name} was removed by a newer coordinator's recovery",
                job=self.context.job_id,
                sink=self.context.sink,
                epoch=self.epoch,
                fix="stop this coordinator; the newer one replays the epoch",
            ) from exc


def encode_rows(batch: pa.RecordBatch, context: OpenContext, epoch: int) -> bytes:
    """One JSON object per row and line, keys in column order, in ASCII: every other
    character is escaped (`\\u2028`), so that no reader splitting lines on more than `\\n`
    (Python's `str.splitlines` splits on U+0085 and U+2028 too) cuts a row in two. Values
    JSON lacks are written as text: timestamps and dates in ISO 8601, decimals as their
    digits, bytes in base64; non-finite floats as `NaN`/`Infinity` (as Python's json reads
    them). A value of any other type is a SchemaMismatchError, raised before anything of the
    batch is written."""
    try:
        lines = [
            json.dumps(row, separators=(",", ":"), default=_as_json) for row in batch.to_pylist()
        ]
        return "".join(f"{line}\n" for line in lines).encode()
    except (TypeError, ValueError) as exc:
        raise SchemaMismatchError(
            f"a row cannot be written as JSON: {exc}",
            job=context.job_id,
            sink=context.sink,
            epoch=epoch,
            fix="cast the column to a string or a number before the sink",
        ) from exc


def _as_json(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} {value!r} has no JSON form")


def _fsync(file: IO[bytes]) -> None:
    os.fsync(file.fileno())
