"""What a restart of the S3 sink finds: the last committed epoch (the highest epoch marker)
and the participants left prepared (multipart uploads under the sink's data folder, each
key naming its participant and generation; layout.py).

Older generations' uploads are handed to the coordinator as handles that can roll them back
(the decision's own handle, with its ETags, is what commits one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle
from durable_sinks.core.sink_base import SinkBase

from . import operations
from .config import S3
from .handles import S3HandleDetails, S3Object
from .layout import Layout

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def last_committed(sink: SinkBase[S3], client: S3Client, layout: Layout) -> int | None:
    """The highest epoch with a marker, in O(log n) listings of at most a few keys
    (galloping, then bisecting, on "is there a marker above epoch x?")."""

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

    if not above(-1):
        return None
    low, step = -1, 1  # a marker exists above `low`
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
