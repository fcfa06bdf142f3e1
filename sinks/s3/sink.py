"""Exactly-once Parquet objects in S3: multipart uploads as phase 1 (docs/s3.md).

- Phase 1 (`write_batch`, `pre_commit`): each participant writes its rows as Parquet into
  multipart uploads (one object per `max_file_bytes`), a part uploaded whenever
  `part_size_bytes` bytes are ready; `pre_commit` closes the Parquet file and uploads the last part.
  The handle carries bucket, keys, upload ids and part ETags. Nothing is visible.
- Phase 2 (`commit_epoch`): CompleteMultipartUpload of each object, create-only
  (`If-None-Match: *`), so a replayed commit never overwrites; an object found complete with
  the participant's metadata and size is already committed. Then `publish_epoch` creates the
  epoch manifest `_epochs/<epoch>.json` (only if absent) once every participant of the epoch
  is complete: the epoch's marker and its readers' proof that it is whole.
- Rollback: AbortMultipartUpload (idempotent).
- Recovery: ListMultipartUploads under the prefix; each upload's key names its participant
  and generation (layout.py), so older generations' uploads are handed to the coordinator,
  which completes the decided ones and aborts the rest.

A decided participant whose upload is gone and whose object is absent is data loss, raised
as ParticipantLostError, never skipped.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    FencedError,
    ManifestCorruptError,
    ParticipantLostError,
    SchemaMismatchError,
    UsageError,
)
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.operations import Holding, Prepared
from durable_sinks.core.protocol import (
    JSON,
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from durable_sinks.core.s3 import is_missing, is_precondition_failed, s3_failure
from durable_sinks.core.schemas import schema_difference

from . import operations
from .checks import check_bucket, claim_prefix, highest_manifest
from .config import S3
from .epochs import EpochManifest
from .layout import DataKey, Layout, epoch_text
from .upload import PARTICIPANT_METADATA, ObjectUpload

if TYPE_CHECKING:
    import pyarrow as pa
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)


class _Participant:
    """The epoch being written by this instance: finished objects and the one being written."""

    def __init__(self, epoch: int, name: ParticipantName) -> None:
        self.epoch = epoch
        self.name = name
        self.finished: list[dict[str, Any]] = []
        self.upload: ObjectUpload | None = None
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0

    def uploads(self) -> list[tuple[str, str]]:
        """(key, upload id) of every upload this participant started."""
        started = [(str(o["key"]), str(o["upload_id"])) for o in self.finished]
        if self.upload is not None:
            started.append((self.upload.key, self.upload.upload_id))
        return started


class S3Sink:
    """Exactly-once Parquet objects under an S3 prefix (see the module docs)."""

    def __init__(self, config: S3) -> None:
        self.config = config
        self.layout = Layout(config.location)
        self._context: OpenContext | None = None
        self._client: S3Client | None = None
        self._current: _Participant | None = None
        self._attempts: dict[int, int] = {}
        self._schema: pa.Schema | None = None
        self._last_committed: int | None = None
        self._counters = {
            "rows": 0.0,
            "bytes": 0.0,
            "parts_uploaded": 0.0,
            "epochs_committed": 0.0,
            "rollbacks": 0.0,
        }

    @property
    def name(self) -> str:
        return self.config.name

    def __repr__(self) -> str:
        return f"S3Sink(name={self.name!r}, path={str(self.layout.location)!r})"

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        self._context = context
        self._client = self.config.connection.client()
        if context.inspect:  # an operator's tool: read only
            self._last_committed = highest_manifest(self._s3(), self.layout, self._fail)
        if context.worker or context.inspect:
            return  # a worker only writes its part: the driver's instance did the rest
        claim_prefix(self._s3(), self.layout, context.job_id, self.name, self._fail)
        self._last_committed = highest_manifest(self._s3(), self.layout, self._fail)

    def close(self) -> None:
        current, self._current = self._current, None
        if current is not None and current.writer is not None:
            current.writer.close()

    def _ctx(self) -> OpenContext:
        if self._context is None:
            raise UsageError(f"{self!r} is not open; the coordinator opens sinks")
        return self._context

    def _s3(self) -> S3Client:
        if self._client is None:
            raise UsageError(f"{self!r} is not open; the coordinator opens sinks")
        return self._client

    def _fail(self, exc: BaseException, action: str, epoch: int | None = None) -> DurableSinkError:
        ctx = self._context
        return s3_failure(
            exc,
            action,
            self.config.connection,
            job=ctx.job_id if ctx else None,
            sink=self.name,
            epoch=epoch,
        )

    def capabilities(self) -> SinkCapabilities:
        return SinkCapabilities(
            exactly_once=True,
            two_phase_commit=True,
            resumable_prepare=True,
            distributed_prepare=True,
            partitioned=True,
        )

    def schema(self) -> pa.Schema | None:
        return self._schema

    def health_check(self) -> None:
        ctx = self._ctx()
        check_bucket(self._s3(), self.layout, self.config, ctx.job_id, self._fail)

    def metrics(self) -> Mapping[str, float]:
        return dict(self._counters)

    # -- phase 1 -------------------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        ctx = self._ctx()
        if self._current is not None:
            # A failed attempt whose rollback did not finish: the coordinator has moved on.
            self._abort(self._current.epoch, self._current.uploads())
            self._current = None
        epoch_text(epoch)  # ConfigError for an epoch beyond the keys' digits, before writing
        attempt = self._attempts.get(epoch, 0)
        self._attempts[epoch] = attempt + 1
        self._current = _Participant(epoch, ctx.participant(epoch, attempt))

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        current = self._require_current()
        if self._schema is None:
            self._schema = batch.schema
        elif not batch.schema.equals(self._schema):
            raise SchemaMismatchError(
                schema_difference(self._schema, batch.schema),
                job=self._ctx().job_id,
                sink=self.name,
                epoch=current.epoch,
                fix="write batches of one schema to an S3 sink; give a new path for a new schema",
            )
        if batch.num_rows == 0:
            return WriteResult(0, 0)
        if current.writer is None:
            self._start_object(current, batch.schema)
        assert current.writer is not None
        assert current.upload is not None
        before = current.upload.size
        current.writer.write_batch(batch)
        current.upload.rows += batch.num_rows
        current.rows += batch.num_rows
        written = current.upload.size - before
        self._counters["rows"] += batch.num_rows
        self._counters["bytes"] += written
        if current.upload.size >= self.config.max_file_bytes:
            self._finish_object(current)
        return WriteResult(batch.num_rows, batch.nbytes)

    def _start_object(self, current: _Participant, schema: pa.Schema) -> None:
        key = self.layout.data_key(DataKey.of(current.name, len(current.finished)))
        current.upload = ObjectUpload(
            self._s3(),
            self.layout.bucket,
            key,
            str(current.name),
            self.config.part_size_bytes,
            lambda exc, action: self._upload_failure(exc, action, current),
        )
        current.writer = pq.ParquetWriter(
            current.upload, schema, compression=self.config.compression
        )

    def _upload_failure(
        self, exc: BaseException, action: str, current: _Participant
    ) -> DurableSinkError:
        """An upload that vanished under a writer was aborted by someone else: a newer
        coordinator's recovery, the driver discarding a losing executor attempt, or a bucket
        lifecycle rule. This attempt can no longer commit."""
        if is_missing(exc):
            return FencedError(
                f"cannot {action}: the upload was aborted by someone else (a newer "
                "coordinator's recovery, the driver discarding this attempt, or a bucket "
                "lifecycle rule)",
                job=self._ctx().job_id,
                sink=self.name,
                epoch=current.epoch,
                fix="if another driver of this job started, stop this one; otherwise restart "
                "the query: the epoch is written again",
            )
        return self._fail(exc, action, current.epoch)

    def _finish_object(self, current: _Participant) -> None:
        if current.writer is None or current.upload is None:
            return
        current.writer.close()
        current.writer = None
        upload, current.upload = current.upload, None
        current.finished.append(upload.finish())
        self._counters["parts_uploaded"] += len(upload.etags)

    def pre_commit(self, epoch: int) -> CommitHandle:
        ctx = self._ctx()
        current = self._require_current()
        self._finish_object(current)
        objects: list[JSON] = [
            {k: o[k] for k in ("key", "upload_id", "etags", "etag", "size", "rows", "sha256")}
            for o in current.finished
        ]
        handle = CommitHandle(
            sink=self.name,
            epoch=epoch,
            participant=str(current.name),
            rows=current.rows,
            bytes=sum(int(o["size"]) for o in current.finished),
            checksum=_combined([str(o["sha256"]) for o in current.finished]),
            details={"job_id": ctx.job_id, "bucket": self.layout.bucket, "objects": objects},
        )
        self._current = None
        return handle

    def _require_current(self) -> _Participant:
        if self._current is None:
            raise UsageError(
                "no epoch is open; call begin_epoch first", job=self._ctx().job_id, sink=self.name
            )
        return self._current

    # -- phase 2 -------------------------------------------------------------------------------
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        """Complete every upload of the participant, create-only. Idempotent: an object
        already complete with this participant's metadata and size is committed."""
        outcome = CommitOutcome.ALREADY_COMMITTED
        for described in _handle_objects(handle, self.name):
            if self._complete(epoch, handle.participant, described):
                outcome = CommitOutcome.COMMITTED
        return outcome

    def _complete(self, epoch: int, participant: str, described: Mapping[str, Any]) -> bool:
        key, upload_id = str(described["key"]), str(described["upload_id"])
        etags = [str(e) for e in described["etags"]]
        try:
            self._s3().complete_multipart_upload(
                Bucket=self.layout.bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={
                    "Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]
                },
                IfNoneMatch="*",
            )
        except Exception as exc:
            if not (is_missing(exc) or is_precondition_failed(exc)):
                raise self._fail(
                    exc, f"complete the upload of s3://{self.layout.bucket}/{key}", epoch
                ) from exc
            self._require_completed(epoch, participant, key, int(described["size"]), exc)
            return False
        return True

    def _require_completed(
        self, epoch: int, participant: str, key: str, size: int, cause: BaseException
    ) -> None:
        """The upload is gone or the key exists: fine if the object is this participant's."""
        where = f"s3://{self.layout.bucket}/{key}"
        try:
            head = self._s3().head_object(Bucket=self.layout.bucket, Key=key)
        except Exception as exc:
            if not is_missing(exc):
                raise self._fail(exc, f"read the metadata of {where}", epoch) from exc
            raise ParticipantLostError(
                f"data loss: participant {participant} is decided to commit, but its upload "
                f"of {where} is gone ({type(cause).__name__}) and the object does not exist",
                job=self._ctx().job_id,
                sink=self.name,
                epoch=epoch,
                fix="someone aborted the upload (a bucket lifecycle rule shorter than "
                "recovery_window_s, or a person): the epoch's rows must be restored from "
                "the source; keep the decision record for the audit",
            ) from cause
        owner = head.get("Metadata", {}).get(PARTICIPANT_METADATA)
        if owner != participant or head.get("ContentLength") != size:
            raise ParticipantLostError(
                f"{where} holds another object (participant {owner!r}, "
                f"{head.get('ContentLength')} bytes), not participant {participant}'s "
                f"{size} bytes",
                job=self._ctx().job_id,
                sink=self.name,
                epoch=epoch,
                fix="give each job its own prefix; never write under a sink's prefix by hand",
            ) from cause

    def publish_epoch(self, epoch: int, handles: Sequence[CommitHandle]) -> CommitOutcome:
        """Create the epoch manifest from the decided participants of this sink (all of them
        committed): create-only; one already there with the same objects is this epoch's."""
        ctx = self._ctx()
        manifest = EpochManifest.of(ctx.job_id, self.name, epoch, handles)
        key = self.layout.manifest_key(epoch)
        where = f"s3://{self.layout.bucket}/{key}"
        outcome = CommitOutcome.COMMITTED
        try:
            self._s3().put_object(
                Bucket=self.layout.bucket,
                Key=key,
                Body=manifest.to_bytes(),
                ContentType="application/json",
                IfNoneMatch="*",
            )
        except Exception as exc:
            if not is_precondition_failed(exc):
                raise self._fail(exc, f"create the epoch manifest {where}", epoch) from exc
            found = self._read_manifest(epoch)
            if found is None or found.objects != manifest.objects:
                raise ManifestCorruptError(
                    f"{where} already exists and lists other objects than epoch {epoch}'s decision",
                    job=ctx.job_id,
                    sink=self.name,
                    epoch=epoch,
                    fix="give each job its own prefix; never write under a sink's prefix by hand",
                ) from exc
            outcome = CommitOutcome.ALREADY_COMMITTED
        if self._last_committed is None or epoch > self._last_committed:
            self._last_committed = epoch
        self._counters["epochs_committed"] += outcome is CommitOutcome.COMMITTED
        return outcome

    def _read_manifest(self, epoch: int) -> EpochManifest | None:
        key = self.layout.manifest_key(epoch)
        try:
            body = self._s3().get_object(Bucket=self.layout.bucket, Key=key)["Body"].read()
        except Exception as exc:
            if is_missing(exc):
                return None
            raise self._fail(exc, f"read s3://{self.layout.bucket}/{key}", epoch) from exc
        return EpochManifest.from_bytes(body, source=f"s3://{self.layout.bucket}/{key}")

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        current = self._current
        if handle is None:
            if current is None or current.epoch != epoch:
                return
            self._current = None
            if current.writer is not None:
                current.writer.close()
            uploads = current.uploads()
        else:
            if current is not None and str(current.name) == handle.participant:
                self._current = None
            uploads = [
                (str(o["key"]), str(o["upload_id"])) for o in _handle_objects(handle, self.name)
            ]
        if self._abort(epoch, uploads):
            self._counters["rollbacks"] += 1

    def _abort(self, epoch: int, uploads: Sequence[tuple[str, str]]) -> bool:
        for key, upload_id in uploads:
            try:
                self._s3().abort_multipart_upload(
                    Bucket=self.layout.bucket, Key=key, UploadId=upload_id
                )
            except Exception as exc:
                if not is_missing(exc):
                    raise self._fail(
                        exc, f"abort the upload of s3://{self.layout.bucket}/{key}", epoch
                    ) from exc
        return bool(uploads)

    # -- recovery ------------------------------------------------------------------------------
    def _uploads(self, prefix: str) -> dict[ParticipantName, list[tuple[str, str]]]:
        """Every upload under `prefix` whose key is one of ours, by participant."""
        found = operations.uploads(self._s3(), self.layout, self._ctx(), prefix, self._fail)
        return {name: [(u.key, u.upload_id) for u in ups] for name, ups in found.items()}

    def _leftover(self, name: ParticipantName, uploads: list[tuple[str, str]]) -> CommitHandle:
        """A handle that can roll the participant back (the decision's own handle, with
        its ETags, is what commits it)."""
        return CommitHandle(
            sink=self.name,
            epoch=name.epoch,
            participant=str(name),
            rows=0,
            bytes=0,
            checksum="",
            details={
                "job_id": self._ctx().job_id,
                "bucket": self.layout.bucket,
                "objects": [{"key": k, "upload_id": u} for k, u in sorted(uploads)],
            },
        )

    def recover_prepared(self) -> list[CommitHandle]:
        ctx = self._ctx()
        found = self._uploads(self.layout.data_folder)
        return [
            self._leftover(name, uploads)
            for name, uploads in sorted(found.items())
            if name.generation < ctx.generation
        ]

    def prepared_participants(self, epoch: int) -> list[CommitHandle]:
        found = self._uploads(self.layout.epoch_folder(epoch))
        return [self._leftover(name, uploads) for name, uploads in sorted(found.items())]

    def last_committed_epoch(self) -> int | None:
        return self._last_committed

    # -- operations (durable-sinks status/inspect/verify; operations.py) -----------------------
    def in_doubt(self) -> list[Prepared]:
        return operations.in_doubt(self._s3(), self.layout, self._ctx(), self._fail, self._leftover)

    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        return operations.holdings(
            self._s3(), self.layout, first, last, self._fail, self._read_manifest
        )

    def live_generations(self) -> list[int]:
        return []  # S3 keeps no sessions


def _handle_objects(handle: CommitHandle, sink: str) -> list[Mapping[str, Any]]:
    objects = handle.details.get("objects")
    if not isinstance(objects, list) or not all(isinstance(o, Mapping) for o in objects):
        raise ConfigError(
            f"commit handle of participant {handle.participant} has no object list",
            sink=sink,
            epoch=handle.epoch,
            fix="this handle was not made by the S3 sink",
        )
    return [o for o in objects if isinstance(o, Mapping)]


def _combined(digests: Sequence[str]) -> str:
    """The participant's checksum: SHA-256 over its objects' SHA-256s, in order."""
    return hashlib.sha256("".join(digests).encode()).hexdigest()
