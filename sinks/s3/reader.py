"""Reading only committed epochs: the epoch markers say which objects are whole epochs.

A reader that lists `<prefix>/epoch=*/` directly may see the objects of an epoch whose
commit is under way (completed before its marker exists) or, after a crash, completed
objects of a decided epoch not yet published. `committed_objects` lists what the markers
list; `committed_dataset` opens exactly those as a `pyarrow.dataset` (with the `epoch` column
from the key), for pyarrow, pandas, Polars or DuckDB::

    from durable_sinks.sinks.s3 import committed_dataset
    table = committed_dataset("s3://bucket/events", endpoint_url=...).to_table()

Under schema evolution the objects hold different schemas: the dataset's schema is theirs
unified (`committed_schema`, core/evolution.py): a column an object lacks reads as null, a
widened column is read in its widest type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durable_sinks.clients.s3 import S3Connection, S3Location, is_missing, s3_failure
from durable_sinks.core.evolution import schema_of_text, unify

from .epochs import EpochMarker, EpochObject
from .layout import Layout

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as ds
    from pyarrow import fs


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
    import pyarrow as pa
    import pyarrow.dataset as ds
    from pyarrow import fs

    connection = connection or S3Connection(**settings)
    location = S3Location.parse(path)
    markers = committed_markers(path, connection, epochs=epochs)
    filesystem = fs.S3FileSystem(**connection.arrow_settings())
    paths = [f"{location.bucket}/{o.key}" for m in markers for o in m.objects]
    schema = _unified(markers, filesystem, location.bucket)
    if schema is not None and "epoch" not in schema.names:
        schema = schema.append(pa.field("epoch", pa.int32()))
    return ds.dataset(
        paths,
        schema=schema,
        format="parquet",
        filesystem=filesystem,
        partitioning=ds.partitioning(pa.schema([("epoch", pa.int32())]), flavor="hive"),
        partition_base_dir=f"{location.bucket}/{location.prefix}",
    )


def committed_schema(
    path: str,
    connection: S3Connection | None = None,
    *,
    epochs: range | None = None,
    **settings: Any,
) -> pa.Schema | None:
    """The schema of the committed epochs under `path` (in `epochs` if given): every
    object's schema unified (core/evolution.py), without the `epoch` column; None when no
    epoch holds an object. Spark readers give it as the read schema (`mergeSchema` does not
    merge int32 with int64 files)::

        from pyspark.sql.pandas.types import from_arrow_schema
        spark.read.schema(from_arrow_schema(committed_schema(path))).parquet(*keys)
    """
    from pyarrow import fs

    connection = connection or S3Connection(**settings)
    markers = committed_markers(path, connection, epochs=epochs)
    filesystem = fs.S3FileSystem(**connection.arrow_settings())
    return _unified(markers, filesystem, S3Location.parse(path).bucket)


def _unified(
    markers: list[EpochMarker], filesystem: fs.FileSystem, bucket: str
) -> pa.Schema | None:
    """The markers' objects' schemas unified, in epoch order; an object whose marker does
    not record its schema (written before schemas were recorded) is read from its footer."""
    import pyarrow.parquet as pq

    schemas = []
    for marker in markers:
        schemas += [schema_of_text(text) for text in marker.schemas]
        schemas += [
            pq.read_schema(f"{bucket}/{listed.key}", filesystem=filesystem)
            for listed in marker.objects
            if listed.schema is None
        ]
    return unify(schemas)
