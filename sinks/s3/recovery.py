"""What a restart of the S3 sink finds: the last committed epoch (the highest epoch marker)
and the participants left prepared (multipart uploads under the sink's data folder, each
key naming its participant and generation; layout.py).

Older generations' uploads are handed to the coordinator as handles that can roll them back
(the decision's own handle, with its ETags, is what commits one)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from durable_sinks.clients.s3 import is_missing
from durable_sinks.core.formats import stored_format
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle
from durable_sinks.core.sink_base import SinkBase

from . import operations
from .config import S3
from .handles import S3HandleDetails, S3Object
from .layout import MAX_EPOCH, Layout

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


NEWEST_HINT = stored_format(
    "S3 newest-epoch hint",
    current=1,
    oldest=1,
    where='`<prefix>/_newest_epoch.json`: JSON `{"epoch": ..., "version": ...}`; a hint of '
    "another version is passed over (the markers are searched without it)",
)


def last_committed(
    sink: SinkBase[S3], client: S3Client, layout: Layout, *, remember: bool = False
) -> int | None:
    """The highest epoch with a marker, found by listings of at most a few keys on "is there
    a marker above epoch x?". Starting from the hint `_newest_epoch.json` (layout.py) it
    takes two listings whatever the number of epochs when the hint still names the newest
    marker, and galloping then bisecting from the hint when newer markers exist; a hint
    that is missing, unreadable or names an epoch above every marker (markers deleted) is
    passed over for the same search from epoch 0 (O(log n) listings). The hint is only ever
    a starting point: the answer is what the listings show. With `remember`, a hint that
    differs from the answer is rewritten (after the marker it names exists: a crash before
    the write leaves the older hint, which the next open checks and passes over)."""

    def above(epoch: int) -> bool:
        start = layout.marker_key(epoch) if epoch >= 0 else layout.marker_folder
        try:
            page = client.list_objects_v2(
                Bucket=layout.bucket, Prefix=layout.marker_folder, StartAfter=start, MaxKeys=10
            )
        except Exception as exc:
            raise sink.failure(exc, f"list s3://{layout.bucket}/{layout.marker_folder}") from exc
        return any(
            layout.parse_marker(o.get("Key", "")) is not None for o in page.get("Contents", [])
        )

    hint = _read_hint(sink, client, layout)
    if hint is not None and above(hint - 1):
        found: int | None = _highest(above, hint - 1)
    elif above(-1):
        found = _highest(above, -1)
    else:
        found = None
    if remember and found is not None and found != hint:
        _write_hint(sink, client, layout, found)
    return found


def _highest(above: Callable[[int], bool], low: int) -> int:
    """The highest epoch with a marker, given that one lies above `low`."""
    step = 1
    while above(low + step):
        low, step = low + step, step * 2
    high = low + step  # none above `high`
    while high - low > 1:
        middle = (low + high) // 2
        if above(middle):
            low = middle
        else:
            high = middle
    return high


def _read_hint(sink: SinkBase[S3], client: S3Client, layout: Layout) -> int | None:
    """The epoch `_newest_epoch.json` names; None when it is missing or not a hint."""
    try:
        body = client.get_object(Bucket=layout.bucket, Key=layout.newest_key)["Body"].read()
    except Exception as exc:
        if is_missing(exc):
            return None
        raise sink.failure(
            exc, f"read s3://{layout.bucket}/{layout.newest_key} (s3:GetObject)"
        ) from exc
    try:
        found = json.loads(body)
        epoch, version = found["epoch"], found["version"]
    except (ValueError, TypeError, KeyError):
        return None  # not a hint (written by hand, cut short): search without one
    if version != NEWEST_HINT.current or not isinstance(epoch, int):
        return None  # another release's: search without it
    return epoch if 0 <= epoch <= MAX_EPOCH else None


def _write_hint(sink: SinkBase[S3], client: S3Client, layout: Layout, epoch: int) -> None:
    try:
        client.put_object(
            Bucket=layout.bucket,
            Key=layout.newest_key,
            Body=json.dumps({"epoch": epoch, "version": NEWEST_HINT.current}).encode(),
            ContentType="application/json",
        )
    except Exception as exc:
        raise sink.failure(
            exc, f"write s3://{layout.bucket}/{layout.newest_key} (s3:PutObject)"
        ) from exc


def leftover(
    sink: SinkBase[S3], layout: Layout, name: ParticipantName, uploads: list[tuple[str, str]]
) -> CommitHandle:
    """A handle that can roll the participant back."""
    objects = tuple(S3Object(k, u) for k, u in sorted(uploads))
    details = S3HandleDetails(sink.context.job_id, layout.bucket, objects).to_json()
    return CommitHandle.leftover(sink.name, name.epoch, str(name), details)


def _uploads(
    sink: SinkBase[S3], client: S3Client, layout: Layout, prefix: str
) -> dict[ParticipantName, list[tuple[str, str]]]:
    """Every upload under `prefix` whose key is one of the sink's, by participant."""
    found = operations.uploads(client, layout, sink.context, prefix, sink.failure)
    return {name: [(u.key, u.upload_id) for u in ups] for name, ups in found.items()}


def leftovers(sink: SinkBase[S3], client: S3Client, layout: Layout) -> list[CommitHandle]:
    """The participants older generations left prepared."""
    found = _uploads(sink, client, layout, layout.data_folder)
    generation = sink.context.generation
    return [
        leftover(sink, layout, name, uploads)
        for name, uploads in sorted(found.items())
        if name.generation < generation
    ]


def prepared_of_epoch(
    sink: SinkBase[S3], client: S3Client, layout: Layout, epoch: int
) -> list[CommitHandle]:
    """Every participant with an upload in the epoch's folder, of any generation."""
    found = _uploads(sink, client, layout, layout.epoch_folder(epoch))
    return [leftover(sink, layout, name, uploads) for name, uploads in sorted(found.items())]
