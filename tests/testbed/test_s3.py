"""The S3 server is a real storage engine: multipart uploads stay invisible until completed,
conditional writes answer 412 as AWS does, requests must be signed, data survives a restart."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from botocore.exceptions import ClientError

from tests.services import S3, S3Endpoint, Testbed

if TYPE_CHECKING:
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

PART = 5 * 1024 * 1024  # S3's minimum size of every part but the last


def _status(error: ClientError) -> int:
    status: int = error.response["ResponseMetadata"]["HTTPStatusCode"]
    return status


def _keys(s3: S3Endpoint, prefix: str) -> list[str]:
    listed = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=prefix)
    return [entry["Key"] for entry in listed.get("Contents", [])]


def _pending_uploads(s3: S3Endpoint, prefix: str) -> list[tuple[str, str]]:
    listed = s3.client().list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix)
    return [(u["Key"], u["UploadId"]) for u in listed.get("Uploads", [])]


def test_multipart_upload_is_invisible_until_completed(s3: S3Endpoint, s3_prefix: str) -> None:
    client = s3.client()
    key = s3_prefix + "epoch-1/part-0.parquet"
    first, last = os.urandom(PART), os.urandom(1000)
    upload_id = client.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
    parts: list[CompletedPartTypeDef] = []
    for number, body in ((1, first), (2, last)):
        etag = client.upload_part(
            Bucket=s3.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
        )["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})

    assert _pending_uploads(s3, s3_prefix) == [(key, upload_id)]
    assert _keys(s3, s3_prefix) == []
    with pytest.raises(ClientError) as missing:
        client.head_object(Bucket=s3.bucket, Key=key)
    assert _status(missing.value) == 404

    client.complete_multipart_upload(
        Bucket=s3.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    assert _keys(s3, s3_prefix) == [key]
    assert client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == first + last
    assert _pending_uploads(s3, s3_prefix) == []


def test_aborted_multipart_upload_leaves_nothing(s3: S3Endpoint, s3_prefix: str) -> None:
    client = s3.client()
    key = s3_prefix + "aborted"
    upload_id = client.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
    client.upload_part(Bucket=s3.bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"x")
    client.abort_multipart_upload(Bucket=s3.bucket, Key=key, UploadId=upload_id)
    assert _pending_uploads(s3, s3_prefix) == []
    assert _keys(s3, s3_prefix) == []


def test_if_none_match_star_is_create_only(s3: S3Endpoint, s3_prefix: str) -> None:
    client = s3.client()
    key = s3_prefix + "decision"
    client.put_object(Bucket=s3.bucket, Key=key, Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as raised:
        client.put_object(Bucket=s3.bucket, Key=key, Body=b"second", IfNoneMatch="*")
    assert _status(raised.value) == 412
    assert client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"first"


def test_if_none_match_star_on_complete_multipart_upload(s3: S3Endpoint, s3_prefix: str) -> None:
    client = s3.client()
    key = s3_prefix + "published"
    client.put_object(Bucket=s3.bucket, Key=key, Body=b"already there")
    upload_id = client.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
    etag = client.upload_part(
        Bucket=s3.bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"late"
    )["ETag"]
    with pytest.raises(ClientError) as raised:
        client.complete_multipart_upload(
            Bucket=s3.bucket,
            Key=key,
            UploadId=upload_id,
            IfNoneMatch="*",
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
        )
    assert _status(raised.value) == 412
    assert client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"already there"
    client.abort_multipart_upload(Bucket=s3.bucket, Key=key, UploadId=upload_id)


def test_if_match_with_stale_etag_fails(s3: S3Endpoint, s3_prefix: str) -> None:
    client = s3.client()
    key = s3_prefix + "generation"
    stale = client.put_object(Bucket=s3.bucket, Key=key, Body=b"generation 1")["ETag"]
    current = client.put_object(Bucket=s3.bucket, Key=key, Body=b"generation 2", IfMatch=stale)[
        "ETag"
    ]
    with pytest.raises(ClientError) as raised:
        client.put_object(Bucket=s3.bucket, Key=key, Body=b"lost update", IfMatch=stale)
    assert _status(raised.value) == 412
    client.put_object(Bucket=s3.bucket, Key=key, Body=b"generation 3", IfMatch=current)
    assert client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"generation 3"


def test_requests_must_be_signed_with_the_secret(s3: S3Endpoint, s3_prefix: str) -> None:
    key = s3_prefix + "private"
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=b"secret data")
    forged = S3Endpoint(s3.endpoint_url, s3.region, s3.access_key_id, "wrong-secret", s3.bucket)
    with pytest.raises(ClientError) as raised:
        forged.client().get_object(Bucket=s3.bucket, Key=key)
    assert _status(raised.value) == 403
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"{s3.endpoint_url}/{s3.bucket}/{key}", timeout=10)  # noqa: S310
    assert anonymous.value.code == 403


#: The SeaweedFS restarted below runs on the shared bed's ports + this (never the shared one:
#: the other pytest-xdist worker's S3 tests would lose their server for seconds).
RESTART_OFFSET = 400


@pytest.fixture
def own_s3(testbed: Testbed, tmp_path: Path) -> Iterator[S3]:
    """A SeaweedFS of this test's own, which it may stop and start."""
    server = S3(testbed.layout.shifted(RESTART_OFFSET, tmp_path / "services"))
    try:
        server.up()
        yield server
    finally:
        server.reset()


@pytest.mark.fault_tier  # a server of its own restarted (22 s); the default suite's S3 is up
def test_objects_survive_a_restart_of_the_server(own_s3: S3) -> None:
    s3 = own_s3.endpoint()
    client = s3.client()
    key = "restart/durable"
    body = os.urandom(100_000)
    client.put_object(Bucket=s3.bucket, Key=key, Body=body)
    upload_id = client.create_multipart_upload(Bucket=s3.bucket, Key=key + ".mpu")["UploadId"]
    client.upload_part(
        Bucket=s3.bucket, Key=key + ".mpu", UploadId=upload_id, PartNumber=1, Body=b"pending"
    )

    own_s3.down()
    own_s3.up()

    client = s3.client()
    assert client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == body
    assert (key + ".mpu", upload_id) in _pending_uploads(s3, "restart/")
    client.abort_multipart_upload(Bucket=s3.bucket, Key=key + ".mpu", UploadId=upload_id)
