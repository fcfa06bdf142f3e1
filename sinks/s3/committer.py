"""Phase 2 of the S3 sink, from handles alone (any process, any instance that wrote nothing):

- `commit`: CompleteMultipartUpload of each of the participant's objects, create-only
  (`If-None-Match: *`), so a replayed commit never overwrites; an object found complete with
  the participant's metadata and size is already committed. A decided participant whose
  upload is gone and whose object is absent is data loss: ParticipantLostError.
- `publish`: the epoch marker `_epochs/<epoch>.json`, create-only, once every participant of
  the epoch is complete; one already there listing the same objects is this epoch's.
- `abort`: AbortMultipartUpload of each upload (idempotent), for a rollback.

A handle is checked before anything is completed or aborted: each object must be a data key
of its own participant under the sink's prefix (a handle read back from a decision or a
marker may be forged)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from durable_sinks.clients.s3 import is_missing, is_precondition_failed
from durable_sinks.core.errors import CorruptRecordError, ParticipantLostError
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle, CommitOutcome
from durable_sinks.core.sink_base import SinkBase

from .config import S3
from .epochs import EpochMarker
from .handles import S3HandleDetails, S3Object
from .layout import DataKey, Layout
from .writer import PARTICIPANT_METADATA

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def own_objects(
    sink: SinkBase[S3], layout: Layout, epoch: int, handle: CommitHandle
) -> tuple[S3Object, ...]:
    """The handle's objects, each checked to be a data key of its own participant under
    the sink's prefix: CorruptRecordError otherwise, nothing completed or aborted."""
    objects = S3HandleDetails.of(handle).objects
    name = ParticipantName.parse(handle.participant)
    for described in objects:
        key = layout.parse_data(described.key)
        if name is None or key is None or key != DataKey.of(name, key.number):
            raise CorruptRecordError(
                f"participant {handle.participant[:200]!r}'s handle names object "
                f"s3://{layout.bucket}/{described.key[:300]}, not one of its own data "
                "keys under the sink's prefix; nothing was completed or aborted for it",
                **sink.where(epoch),
                fix="the decision or the sink's storage holds a handle this job did not "
                "write: check who writes there, remove the record, then restart",
            )
    return objects


#: Participants `S3Sink.commit_participants` completes at once: within the client's connection
#: pool (16), beside a writer's.
COMMIT_REQUESTS = 12


def commit(
    sink: SinkBase[S3], client: S3Client, layout: Layout, epoch: int, handle: CommitHandle
) -> CommitOutcome:
    """Complete every upload of the participant, create-only. Idempotent: an object
    already complete with this participant's metadata and size is committed."""
    outcome = CommitOutcome.ALREADY_COMMITTED
    for described in own_objects(sink, layout, epoch, handle):
        if _complete(sink, client, layout, epoch, handle.participant, described):
            outcome = CommitOutcome.COMMITTED
    return outcome


def _complete(
    sink: SinkBase[S3],
    client: S3Client,
    layout: Layout,
    epoch: int,
    participant: str,
    described: S3Object,
) -> bool:
    key, upload_id, etags = described.key, described.upload_id, described.etags
    try:
        client.complete_multipart_upload(
            Bucket=layout.bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={
                "Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]
            },
            IfNoneMatch="*",
        )
    except Exception as exc:
        if not (is_missing(exc) or is_precondition_failed(exc)):
            raise sink.failure(
                exc, f"complete the upload of s3://{layout.bucket}/{key}", epoch
            ) from exc
        _require_completed(sink, client, layout, epoch, participant, described, exc)
        return False
    return True


def _require_completed(
    sink: SinkBase[S3],
    client: S3Client,
    layout: Layout,
    epoch: int,
    participant: str,
    described: S3Object,
    cause: BaseException,
) -> None:
    """The upload is gone or the key exists: fine if the object is this participant's."""
    key, size = described.key, described.size
    where = f"s3://{layout.bucket}/{key}"
    try:
        head = client.head_object(Bucket=layout.bucket, Key=key)
    except Exception as exc:
        if not is_missing(exc):
            raise sink.failure(exc, f"read the metadata of {where}", epoch) from exc
        raise ParticipantLostError(
            f"data loss: participant {participant} is decided to commit, but its upload "
            f"of {where} is gone ({type(cause).__name__}) and the object does not exist",
            **sink.where(epoch),
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
            **sink.where(epoch),
            fix="give each job its own prefix; never write under a sink's prefix by hand",
        ) from cause


def publish(
    sink: SinkBase[S3],
    client: S3Client,
    layout: Layout,
    epoch: int,
    handles: Sequence[CommitHandle],
) -> CommitOutcome:
    """Create the epoch marker from the decided participants of the sink (all of them
    committed): create-only; one already there with the same objects is this epoch's."""
    marker = EpochMarker.of(sink.context.job_id, sink.name, epoch, handles)
    key = layout.marker_key(epoch)
    where = f"s3://{layout.bucket}/{key}"
    try:
        client.put_object(
            Bucket=layout.bucket,
            Key=key,
            Body=marker.to_bytes(),
            ContentType="application/json",
            IfNoneMatch="*",
        )
    except Exception as exc:
        if not is_precondition_failed(exc):
            raise sink.failure(exc, f"create the epoch marker {where}", epoch) from exc
        found = read_marker(sink, client, layout, epoch)
        if found is None or (found.objects, found.schemas) != (marker.objects, marker.schemas):
            raise CorruptRecordError(
                f"{where} already exists and lists other objects than epoch {epoch}'s decision",
                **sink.where(epoch),
                fix="give each job its own prefix; never write under a sink's prefix by hand",
            ) from exc
        return CommitOutcome.ALREADY_COMMITTED
    return CommitOutcome.COMMITTED


def read_marker(
    sink: SinkBase[S3], client: S3Client, layout: Layout, epoch: int
) -> EpochMarker | None:
    """The epoch's marker, None when it has none."""
    key = layout.marker_key(epoch)
    try:
        body = client.get_object(Bucket=layout.bucket, Key=key)["Body"].read()
    except Exception as exc:
        if is_missing(exc):
            return None
        raise sink.failure(exc, f"read s3://{layout.bucket}/{key}", epoch) from exc
    return EpochMarker.from_bytes(body, source=f"s3://{layout.bucket}/{key}")


def abort(
    sink: SinkBase[S3],
    client: S3Client,
    layout: Layout,
    epoch: int,
    uploads: Sequence[tuple[str, str]],
) -> bool:
    """Abort each (key, upload id); True if there was any. An upload already gone is fine."""
    for key, upload_id in uploads:
        try:
            client.abort_multipart_upload(Bucket=layout.bucket, Key=key, UploadId=upload_id)
        except Exception as exc:
            if not is_missing(exc):
                raise sink.failure(
                    exc, f"abort the upload of s3://{layout.bucket}/{key}", epoch
                ) from exc
    return bool(uploads)
