"""What `durable-sinks` reads from S3 (core/operations.py): the job's multipart uploads (its
prepared participants) and, per epoch, the marker checked against the objects under the
epoch's folder (each listed object present with its size and ETag, none unlisted). Read only.

Also the listing recovery uses: every upload under a folder, by participant; and `drop_job`,
the removal of a retired job's bookkeeping under the prefix (the only call here that writes,
with `apply`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durable_sinks.clients.s3 import is_missing
from durable_sinks.core.errors import CorruptRecordError, DurableSinkError
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.operations import Bookkeeping, Holding, Prepared
from durable_sinks.core.protocol import OpenContext

from .epochs import EpochMarker
from .layout import Layout

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

Failure = Callable[[BaseException, str], DurableSinkError]


@dataclass(frozen=True)
class Upload:
    key: str
    upload_id: str
    initiated: float | None


def uploads(
    client: S3Client, layout: Layout, context: OpenContext, prefix: str, fail: Failure
) -> dict[ParticipantName, list[Upload]]:
    """Every multipart upload under `prefix` whose key is one of the sink's, by participant."""
    found: dict[ParticipantName, list[Upload]] = {}
    paginator = client.get_paginator("list_multipart_uploads")
    try:
        for page in paginator.paginate(Bucket=layout.bucket, Prefix=prefix):
            for upload in page.get("Uploads", []):
                key, upload_id = upload.get("Key", ""), upload.get("UploadId", "")
                parsed = layout.parse_data(key)
                if parsed is None or not upload_id:
                    continue
                name = ParticipantName.build(
                    context.job_id,
                    context.sink,
                    parsed.epoch,
                    parsed.part,
                    parsed.generation,
                    parsed.attempt,
                )
                started = upload.get("Initiated")
                initiated = started.timestamp() if started is not None else None
                found.setdefault(name, []).append(Upload(key, upload_id, initiated))
    except Exception as exc:
        raise fail(exc, f"list the multipart uploads under s3://{layout.bucket}/{prefix}") from exc
    return found


def upload_size(client: S3Client, layout: Layout, upload: Upload, fail: Failure) -> int:
    """Bytes uploaded so far into one multipart upload (its parts)."""
    total = 0
    paginator = client.get_paginator("list_parts")
    try:
        for page in paginator.paginate(
            Bucket=layout.bucket, Key=upload.key, UploadId=upload.upload_id
        ):
            total += sum(int(p.get("Size", 0)) for p in page.get("Parts", []))
    except Exception as exc:
        raise fail(exc, f"list the parts of s3://{layout.bucket}/{upload.key}") from exc
    return total


def in_doubt(
    client: S3Client,
    layout: Layout,
    context: OpenContext,
    fail: Failure,
    leftover: Callable[[ParticipantName, list[tuple[str, str]]], Any],
) -> list[Prepared]:
    """Every participant with an upload under the sink's data folder, any generation."""
    now = time.time()
    found = []
    for name, started in sorted(uploads(client, layout, context, layout.data_folder, fail).items()):
        first = min((u.initiated for u in started if u.initiated is not None), default=None)
        size = sum(upload_size(client, layout, u, fail) for u in started)
        keys = ", ".join(f"s3://{layout.bucket}/{u.key}" for u in started)
        what = f"multipart upload{'s' if len(started) > 1 else ''} {keys}"
        handle = leftover(name, [(u.key, u.upload_id) for u in started])
        found.append(Prepared(handle, what, None if first is None else now - first, size))
    return found


def _objects(client: S3Client, layout: Layout, prefix: str, fail: Failure) -> Iterator[Any]:
    paginator = client.get_paginator("list_objects_v2")
    try:
        for page in paginator.paginate(Bucket=layout.bucket, Prefix=prefix):
            yield from page.get("Contents", [])
    except Exception as exc:
        raise fail(exc, f"list s3://{layout.bucket}/{prefix}") from exc


def holdings(
    client: S3Client,
    layout: Layout,
    first: int,
    last: int,
    fail: Failure,
    read_marker: Callable[[int], EpochMarker | None],
) -> dict[int, Holding]:
    """Per epoch in `first..last` with a marker or data objects: the marker checked against
    the objects in the epoch's folder."""
    listed: dict[int, dict[str, Any]] = {}
    for item in _objects(client, layout, layout.data_folder, fail):
        parsed = layout.parse_data(item.get("Key", ""))
        if parsed is not None and first <= parsed.epoch <= last:
            listed.setdefault(parsed.epoch, {})[item["Key"]] = item
    markers = {
        epoch
        for item in _objects(client, layout, layout.marker_folder, fail)
        if (epoch := layout.parse_marker(item.get("Key", ""))) is not None
        and first <= epoch <= last
    }
    found = {}
    for epoch in sorted(markers | set(listed)):
        objects = listed.get(epoch, {})
        marker = None
        try:
            marker = read_marker(epoch) if epoch in markers else None
        except CorruptRecordError as exc:
            found[epoch] = Holding(epoch, marker=True, problems=(str(exc),))
            continue
        if marker is None:
            unlisted = tuple(f"object s3://{layout.bucket}/{k} has no marker" for k in objects)
            found[epoch] = Holding(epoch, marker=False, problems=unlisted)
            continue
        found[epoch] = _checked(layout, marker, objects)
    return found


def _checked(layout: Layout, marker: EpochMarker, objects: dict[str, Any]) -> Holding:
    problems = []
    for listed in marker.objects:
        where = f"s3://{layout.bucket}/{listed.key}"
        item = objects.get(listed.key)
        if item is None:
            problems.append(f"{where} is in the epoch marker but missing")
        elif int(item.get("Size", -1)) != listed.size:
            problems.append(f"{where} has {item.get('Size')} bytes, the epoch marker {listed.size}")
        elif listed.etag is not None and _etag(item.get("ETag")) != _etag(listed.etag):
            problems.append(f"{where} has ETag {item.get('ETag')}, the epoch marker {listed.etag}")
    known = {o.key for o in marker.objects}
    problems += [
        f"s3://{layout.bucket}/{key} is not in the epoch's marker (a copy or a stray write?)"
        for key in sorted(objects)
        if key not in known
    ]
    return Holding(
        marker.epoch,
        marker=True,
        participants=frozenset(o.participant for o in marker.objects),
        rows=marker.rows,
        problems=tuple(problems),
    )


def _etag(value: object) -> str:
    return str(value or "").strip('"')


#: Keys per DeleteObjects request (the S3 API's limit).
DELETE_BATCH = 1000
#: Why the epoch markers stay unless asked for.
MARKERS_KEPT = (
    "readers that read through the markers (committed_dataset, committed_markers) find the "
    "committed epochs by them: give --epoch-markers to remove them too"
)


def drop_job(
    client: S3Client,
    layout: Layout,
    context: OpenContext,
    fail: Failure,
    *,
    apply: bool,
    epoch_markers: bool,
) -> list[Bookkeeping]:
    """The job's bookkeeping under the prefix: `_job.json` (when it names this job and sink)
    and the newest-epoch hint beside it,
    the start-up probes' leftovers under `_durable/` (objects and uploads), and the epoch
    markers under `_epochs/` (removed only with `epoch_markers`). With `apply`, the removable
    ones are deleted. Data objects (`epoch=*/`) and the decision store's `_decisions/` are
    never touched: every key deleted was listed under the sink's own folders and is checked
    to lie there."""
    found: list[Bookkeeping] = []
    bucket = layout.bucket
    owner = layout.owner_key
    if _owned(client, layout, context, fail):
        found.append(Bookkeeping("owner file _job.json", f"s3://{bucket}/{owner}", 1))
        if apply:
            _delete(client, layout, context, [owner], fail)
        hint = layout.newest_key
        if _exists(client, layout, hint, fail):
            found.append(Bookkeeping("newest-epoch hint", f"s3://{bucket}/{hint}", 1))
            if apply:
                _delete(client, layout, context, [hint], fail)
    probes = [
        item["Key"]
        for item in _objects(client, layout, layout.probe_folder, fail)
        if _under(item.get("Key", ""), layout.probe_folder)
    ]
    probe_uploads = _uploads_under(client, layout, layout.probe_folder, fail)
    if probes or probe_uploads:
        where = f"s3://{bucket}/{layout.probe_folder}"
        found.append(
            Bookkeeping("start-up probe leftovers", where, len(probes) + len(probe_uploads))
        )
        if apply:
            _delete(client, layout, context, probes, fail)
            for key, upload_id in probe_uploads:
                try:
                    client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
                except Exception as exc:
                    raise fail(exc, f"abort the probe upload s3://{bucket}/{key}") from exc
    markers = [
        item["Key"]
        for item in _objects(client, layout, layout.marker_folder, fail)
        if layout.parse_marker(item.get("Key", "")) is not None
    ]
    if markers:
        where = f"s3://{bucket}/{layout.marker_folder}"
        kept = None if epoch_markers else MARKERS_KEPT
        found.append(Bookkeeping("epoch markers", where, len(markers), kept))
        if apply and epoch_markers:
            _delete(client, layout, context, markers, fail)
    return found


def _under(key: str, folder: str) -> bool:
    """Whether `key` lies in `folder` (a listing's key, checked before it is deleted)."""
    rest = key[len(folder) :] if key.startswith(folder) else ""
    return bool(rest) and ".." not in rest.split("/")


def _exists(client: S3Client, layout: Layout, key: str, fail: Failure) -> bool:
    try:
        client.head_object(Bucket=layout.bucket, Key=key)
    except Exception as exc:
        if is_missing(exc):
            return False
        raise fail(exc, f"read s3://{layout.bucket}/{key}") from exc
    return True


def _owned(client: S3Client, layout: Layout, context: OpenContext, fail: Failure) -> bool:
    """Whether `_job.json` exists and names this job and sink (one naming another is not
    this job's to remove)."""
    key = layout.owner_key
    try:
        body = client.get_object(Bucket=layout.bucket, Key=key)["Body"].read()
    except Exception as exc:
        if is_missing(exc):
            return False
        raise fail(exc, f"read s3://{layout.bucket}/{key}") from exc
    try:
        found = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(found, dict)
        and found.get("job_id") == context.job_id
        and found.get("sink") == context.sink
    )


def _uploads_under(
    client: S3Client, layout: Layout, folder: str, fail: Failure
) -> list[tuple[str, str]]:
    found = []
    paginator = client.get_paginator("list_multipart_uploads")
    try:
        for page in paginator.paginate(Bucket=layout.bucket, Prefix=folder):
            for upload in page.get("Uploads", []):
                key, upload_id = upload.get("Key", ""), upload.get("UploadId", "")
                if upload_id and _under(key, folder):
                    found.append((key, upload_id))
    except Exception as exc:
        raise fail(exc, f"list the multipart uploads under s3://{layout.bucket}/{folder}") from exc
    return found


def _delete(
    client: S3Client, layout: Layout, context: OpenContext, keys: list[str], fail: Failure
) -> None:
    """Delete `keys` (each under the sink's prefix, checked again here); a key S3 refuses to
    delete fails the call, naming it."""
    folder = layout.location.folder
    for key in keys:
        if not _under(key, folder):
            raise DurableSinkError(
                f"refusing to delete s3://{layout.bucket}/{key}: not under the sink's prefix "
                f"s3://{layout.bucket}/{folder}",
                job=context.job_id,
                sink=context.sink,
                fix="report this: drop deletes only what it listed under the sink's prefix",
            )
    for start in range(0, len(keys), DELETE_BATCH):
        chunk = keys[start : start + DELETE_BATCH]
        try:
            answer = client.delete_objects(
                Bucket=layout.bucket,
                Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
            )
        except Exception as exc:
            raise fail(
                exc, f"delete {len(chunk)} object(s) under s3://{layout.bucket}/{folder}"
            ) from exc
        refused = answer.get("Errors", [])
        if refused:
            first = refused[0]
            raise DurableSinkError(
                f"S3 refused to delete {len(refused)} object(s) under s3://{layout.bucket}/"
                f"{folder}, the first s3://{layout.bucket}/{first.get('Key')}: "
                f"{first.get('Code')} {first.get('Message')}",
                job=context.job_id,
                sink=context.sink,
                fix="grant s3:DeleteObject on the prefix, then run durable-sinks drop --apply "
                "again (it removes what is left)",
            )
