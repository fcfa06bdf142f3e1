"""What an S3 participant's commit handle holds (typed and versioned, core/handles.py): the
bucket and, per object, its multipart upload and what the epoch marker will list."""

from __future__ import annotations

from dataclasses import dataclass

from durable_sinks.core.handles import HandleDetails


@dataclass(frozen=True)
class S3Object:
    """One object of a participant: its multipart upload and, once prepared, the ETag of each
    part, its size, rows and SHA-256 (a handle that only rolls back holds key and upload id),
    and the Arrow schema of its Parquet file (core/evolution.schema_text; None in handles
    written before the S3 sink recorded schemas)."""

    key: str
    upload_id: str
    etags: tuple[str, ...] = ()
    etag: str | None = None
    size: int = 0
    rows: int = 0
    sha256: str = ""
    schema: str | None = None


@dataclass(frozen=True)
class S3HandleDetails(HandleDetails):
    """An S3 participant's handle details: the bucket and every object it uploads."""

    job_id: str
    bucket: str
    objects: tuple[S3Object, ...]
