"""What `durable-sinks` reads from S3 (core/operations.py): the job's multipart uploads (its
prepared participants) and, per epoch, the marker checked against the objects under the
epoch's folder (each listed object present with its size and ETag, none unlisted). Read only.

Also the listing recovery uses: every upload under a folder, by participant.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durable_sinks.core.errors import CorruptRecordError, DurableSinkError
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.operations import Holding, Prepared
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
