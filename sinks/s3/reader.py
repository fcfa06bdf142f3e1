"""Reading only committed epochs: the epoch markers say which objects are whole epochs.

A reader that lists `<prefix>/epoch=*/` directly may see the objects of an epoch whose
commit is under way (completed before its marker exists) or, after a crash, completed
objects of a decided epoch not yet published. `committed_objects` lists what the markers
list; `committed_dataset` opens exactly those as a `pyarrow.dataset` (with the `epoch` column
from the key), for pyarrow, pandas, Polars or DuckDB::

    from durable_sinks.sinks.s3 import committed_dataset
    table = committed_dataset("s3://bucket/events", endpoint_url=...).to_table()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durable_sinks.core.s3 import S3Connection, S3Location, is_missing, s3_failure

from .epochs import EpochMarker, EpochObject
from .layout import Layout

if TYPE_CHECKING:
    import pyarrow.dataset as ds


def committed_markers(
    path: str, connection: S3Connection | None = None, *, epochs: range | None = None
) -> list[EpochMarker]:
    """The markers of every committed epoch under `path` (in `epochs` if given), in epoch
    order. Markers are immutable: a reader may cache them by epoch."""
    connection = connection or S3Connection()
    layout = Layout(S3Location.parse(path))
    client = connection.client()
    found: list[EpochMarker] = []
    start = layout.marker_key(epochs.start - 1) if epochs and epochs.start > 0 else ""
    try:
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=layout.bucket, Prefix=layout.marker_folder, StartAfter=start
        )
        for page in pages:
            for entry in page.get("Contents", []):
                epoch = layout.parse_marker(entry.get("Key", ""))
                if epoch is None or (epochs is not None and epoch not in epochs):
                    continue
                key = layout.marker_key(epoch)
                body = client.get_object(Bucket=layout.bucket, Key=key)["Body"].read()
                found.append(EpochMarker.from_bytes(body, source=f"s3://{layout.bucket}/{key}"))
    except Exception as exc:
        if is_missing(exc):
            return found
        raise s3_failure(exc, f"read the epoch markers of {path}", connection) from exc
    return found


def committed_objects(
    path: str, connection: S3Connection | None = None, *, epochs: range | None = None
) -> list[EpochObject]:
    """Every object of the committed epochs under `path`, in epoch and key order."""
    return [o for m in committed_markers(path, connection, epochs=epochs) for o in m.objects]


def committed_dataset(
    path: str,
    connection: S3Connection | None = None,
    *,
    epochs: range | None = None,
    **settings: Any,
) -> ds.Dataset:
    """A `pyarrow.dataset` of the committed epochs' objects under `path`, with an `epoch`
    column. `settings` are S3Connection's (endpoint_url, region, access_key_id, ...) when no
    `connection` is given."""
    import pyarrow.dataset as ds
    from pyarrow import fs

    connection = connection or S3Connection(**settings)
    location = S3Location.parse(path)
    objects = committed_objects(path, connection, epochs=epochs)
    filesystem = fs.S3FileSystem(**connection.arrow_settings())
    return ds.dataset(
        [f"{location.bucket}/{o.key}" for o in objects],
        format="parquet",
        filesystem=filesystem,
        partitioning=ds.partitioning(flavor="hive"),
        partition_base_dir=f"{location.bucket}/{location.prefix}",
    )
