"""What S3 tests assert on, read straight from the server: the objects and the incomplete
multipart uploads under a prefix (every page of the listing), clean-up of a prefix, and
buckets of a test's own.

Listings go through boto3's paginators, which both test-bed servers page correctly even though
neither follows AWS's markers to the letter (docs/testbed.md, "S3 servers compared"): SeaweedFS
sends no NextKeyMarker and pages by upload id; moto returns every upload in one page.

    assert object_keys(client, bucket, prefix) == [prefix + "part-0.parquet"]
    assert incomplete_uploads(client, bucket, prefix) == []
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from tests.services import S3Endpoint

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = [
    "Upload",
    "delete_prefix",
    "incomplete_uploads",
    "object_keys",
    "temporary_bucket",
]


@dataclass(frozen=True, order=True)
class Upload:
    """An incomplete multipart upload. `initiated` is what the server says: moto answers
    2010-11-10T20:48:33Z for every upload."""

    key: str
    upload_id: str
    initiated: datetime | None = None


def incomplete_uploads(client: S3Client, bucket: str, prefix: str = "") -> list[Upload]:
    """Every multipart upload under `prefix` that is neither completed nor aborted, sorted by
    key and upload id (the servers list them in different orders). A server that listed one
    twice would show it twice here."""
    uploads: list[Upload] = []
    for page in client.get_paginator("list_multipart_uploads").paginate(
        Bucket=bucket, Prefix=prefix
    ):
        uploads.extend(
            Upload(u["Key"], u["UploadId"], u.get("Initiated")) for u in page.get("Uploads", [])
        )
    return sorted(uploads)


def object_keys(client: S3Client, bucket: str, prefix: str = "") -> list[str]:
    """The keys of every object under `prefix`, sorted."""
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(entry["Key"] for entry in page.get("Contents", []))
    return sorted(keys)


def delete_prefix(client: S3Client, bucket: str, prefix: str) -> None:
    """Abort every incomplete upload and delete every object under `prefix`.

    An upload that is gone by the time it is aborted (completed or aborted meanwhile) is
    fine: the prefix is empty afterwards either way.
    """
    from botocore.exceptions import ClientError

    if not prefix:
        raise ValueError("delete_prefix needs a prefix: it never empties a whole bucket")
    for upload in incomplete_uploads(client, bucket, prefix):
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=upload.key, UploadId=upload.upload_id)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchUpload":
                raise
    keys = object_keys(client, bucket, prefix)
    for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
        batch = keys[start : start + 1000]
        answer = client.delete_objects(
            Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
        )
        if answer.get("Errors"):
            raise RuntimeError(f"could not delete under {prefix!r}: {answer['Errors'][:5]}")


@contextlib.contextmanager
def temporary_bucket(endpoint: S3Endpoint, hint: str = "test") -> Iterator[S3Endpoint]:
    """A new, empty bucket of the test's own (for bucket-wide settings such as lifecycle
    rules, which tests sharing the test bed's bucket would overwrite for each other), given
    as `endpoint` with its bucket replaced; emptied and deleted afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", hint.lower()).strip("-")[:30] or "test"
    name = f"ds-{slug}-{uuid.uuid4().hex[:12]}"
    client = endpoint.client()
    client.create_bucket(Bucket=name)
    try:
        yield replace(endpoint, bucket=name)
    finally:
        for upload in incomplete_uploads(client, name):
            client.abort_multipart_upload(Bucket=name, Key=upload.key, UploadId=upload.upload_id)
        for key in object_keys(client, name):
            client.delete_object(Bucket=name, Key=key)
        client.delete_bucket(Bucket=name)
