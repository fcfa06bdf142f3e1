"""The two S3 servers of the test bed, SeaweedFS and moto, on every call an S3 sink and an S3
decision store make: where they agree with AWS, and where each deviates (asserted as it is,
so that a change in either server, a fix included, shows here first). docs/testbed.md,
"S3 servers compared", is the same list in prose.

Every test runs once per server (`[seaweedfs]`, `[moto]`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import TYPE_CHECKING, Literal, TypeVar

import pytest
from botocore.exceptions import ClientError

from tests.conftest import UniqueNames
from tests.services import S3Endpoint
from tests.support.s3_objects import (
    delete_prefix,
    incomplete_uploads,
    object_keys,
    temporary_bucket,
)

UTC = timezone.utc

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

PART = 5 * 1024 * 1024  # S3's minimum size of every part but the last
MOTO_INITIATED = datetime(2010, 11, 10, 20, 48, 33, tzinfo=UTC)

T = TypeVar("T")
ServerName = Literal["seaweedfs", "moto"]


@dataclass(frozen=True)
class Server:
    name: ServerName
    endpoint: S3Endpoint

    @property
    def bucket(self) -> str:
        return self.endpoint.bucket

    def client(self) -> S3Client:
        return self.endpoint.client()

    def expect(self, *, seaweedfs: T, moto: T) -> T:
        """What this server answers where the two differ."""
        return seaweedfs if self.name == "seaweedfs" else moto


@pytest.fixture(params=["seaweedfs", "moto"])
def server(request: pytest.FixtureRequest) -> Server:
    fixture = {"seaweedfs": "s3", "moto": "moto_s3"}[request.param]
    endpoint: S3Endpoint = request.getfixturevalue(fixture)
    return Server(request.param, endpoint)


@pytest.fixture
def prefix(server: Server, unique: UniqueNames) -> Iterator[str]:
    """A prefix of the test's own, emptied afterwards (moto keeps everything in memory)."""
    name = unique.name("servers") + "/"
    yield name
    delete_prefix(server.client(), server.bucket, name)


def _code(call: ClientError) -> str:
    """The error code, or the HTTP status where the server sent no body (HEAD)."""
    error = call.response.get("Error", {})
    return str(error.get("Code") or call.response["ResponseMetadata"]["HTTPStatusCode"])


def _fails(action: Callable[[], object]) -> str:
    with pytest.raises(ClientError) as raised:
        action()
    return _code(raised.value)


def _upload(client: S3Client, bucket: str, key: str, *bodies: bytes) -> tuple[str, list[str]]:
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    etags = [
        client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
        )["ETag"]
        for number, body in enumerate(bodies, start=1)
    ]
    return upload_id, etags


def _parts(etags: list[str]) -> list[CompletedPartTypeDef]:
    return [{"PartNumber": n, "ETag": etag} for n, etag in enumerate(etags, start=1)]


# -- multipart upload ------------------------------------------------------------------------


def test_multipart_upload_round_trip(server: Server, prefix: str) -> None:
    """Create (with metadata), parts, ListParts (paged), complete with If-None-Match: * on a
    new key; the object appears only then, with the metadata and an md5-of-md5s-N ETag."""
    client, key = server.client(), prefix + "epoch-7/part-0.parquet"
    first, last = os.urandom(PART), b"the tail"
    upload_id = client.create_multipart_upload(
        Bucket=server.bucket, Key=key, Metadata={"DS-Epoch": "7", "ds-job": "orders"}
    )["UploadId"]
    etags = [
        client.upload_part(
            Bucket=server.bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=body
        )["ETag"]
        for n, body in ((1, first), (2, last))
    ]
    assert etags == [f'"{hashlib.md5(b).hexdigest()}"' for b in (first, last)]  # noqa: S324

    listed = client.list_parts(Bucket=server.bucket, Key=key, UploadId=upload_id)
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed["Parts"]] == [
        (1, etags[0], PART),
        (2, etags[1], len(last)),
    ]
    page = client.list_parts(Bucket=server.bucket, Key=key, UploadId=upload_id, MaxParts=1)
    assert (page["IsTruncated"], page["NextPartNumberMarker"]) == (True, 1)
    rest = client.list_parts(Bucket=server.bucket, Key=key, UploadId=upload_id, PartNumberMarker=1)
    assert [p["PartNumber"] for p in rest["Parts"]] == [2]

    assert _fails(lambda: client.head_object(Bucket=server.bucket, Key=key)) == "404"
    assert object_keys(client, server.bucket, prefix) == []

    done = client.complete_multipart_upload(
        Bucket=server.bucket,
        Key=key,
        UploadId=upload_id,
        IfNoneMatch="*",
        MultipartUpload={"Parts": _parts(etags)},
    )
    digests = b"".join(hashlib.md5(b).digest() for b in (first, last))  # noqa: S324
    multipart_etag = f'"{hashlib.md5(digests).hexdigest()}-2"'  # noqa: S324
    assert done["ETag"] == multipart_etag
    head = client.head_object(Bucket=server.bucket, Key=key)
    assert head["ETag"] == multipart_etag
    assert head["ContentLength"] == PART + len(last)
    assert head["Metadata"] == {"ds-epoch": "7", "ds-job": "orders"}  # keys lower-cased
    assert client.get_object(Bucket=server.bucket, Key=key)["Body"].read() == first + last
    assert incomplete_uploads(client, server.bucket, prefix) == []


def test_complete_refuses_an_existing_key_and_keeps_the_upload(server: Server, prefix: str) -> None:
    client, key = server.client(), prefix + "published"
    client.put_object(Bucket=server.bucket, Key=key, Body=b"already there")
    upload_id, etags = _upload(client, server.bucket, key, b"late")
    code = _fails(
        lambda: client.complete_multipart_upload(
            Bucket=server.bucket,
            Key=key,
            UploadId=upload_id,
            IfNoneMatch="*",
            MultipartUpload={"Parts": _parts(etags)},
        )
    )
    assert code == "PreconditionFailed"
    assert client.get_object(Bucket=server.bucket, Key=key)["Body"].read() == b"already there"
    assert [u.upload_id for u in incomplete_uploads(client, server.bucket, key)] == [upload_id]


def test_complete_retried_after_it_succeeded(server: Server, prefix: str) -> None:
    """The retry a sink makes when the answer to its CompleteMultipartUpload was lost. Without
    a condition both servers answer 200 again; with If-None-Match: * SeaweedFS answers 412
    (the key now exists, though this very upload made it) and moto 200."""
    client, key = server.client(), prefix + "retried"
    upload_id, etags = _upload(client, server.bucket, key, b"once")

    def complete(**condition: str) -> str:
        answer = client.complete_multipart_upload(
            Bucket=server.bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": _parts(etags)},
            **condition,  # type: ignore[arg-type]
        )
        return answer["ETag"]

    etag = complete(IfNoneMatch="*")
    assert complete() == etag
    if server.name == "seaweedfs":
        assert _fails(lambda: complete(IfNoneMatch="*")) == "PreconditionFailed"
    else:
        assert complete(IfNoneMatch="*") == etag
    assert client.get_object(Bucket=server.bucket, Key=key)["Body"].read() == b"once"
    listed = partial(client.list_parts, Bucket=server.bucket, Key=key, UploadId=upload_id)
    assert _fails(listed) == "NoSuchUpload"
    abort = partial(
        client.abort_multipart_upload, Bucket=server.bucket, Key=key, UploadId=upload_id
    )
    if server.name == "seaweedfs":
        abort()  # 204, and the object stays
    else:
        assert _fails(abort) == "NoSuchUpload"
    assert client.get_object(Bucket=server.bucket, Key=key)["Body"].read() == b"once"


def test_abort_twice_and_abort_of_an_unknown_upload(server: Server, prefix: str) -> None:
    """A second abort: SeaweedFS 204 again, moto NoSuchUpload (a sink must accept both). An
    upload id the server never issued: NoSuchUpload on both."""
    client, key = server.client(), prefix + "aborted"
    upload_id, _ = _upload(client, server.bucket, key, b"x")

    def abort() -> None:
        client.abort_multipart_upload(Bucket=server.bucket, Key=key, UploadId=upload_id)

    abort()
    assert incomplete_uploads(client, server.bucket, prefix) == []
    if server.name == "seaweedfs":
        abort()
    else:
        assert _fails(abort) == "NoSuchUpload"
    unknown = partial(
        client.abort_multipart_upload, Bucket=server.bucket, Key=key, UploadId="no-such-upload"
    )
    assert _fails(unknown) == "NoSuchUpload"
    assert object_keys(client, server.bucket, prefix) == []


def test_calls_on_an_aborted_upload(server: Server, prefix: str) -> None:
    """UploadPart and CompleteMultipartUpload on an aborted upload: NoSuchUpload on SeaweedFS
    (as AWS), 500 on moto (after botocore's retries); ListParts NoSuchUpload on both."""
    client, key = server.client(), prefix + "gone"
    upload_id, etags = _upload(client, server.bucket, key, b"x")
    client.abort_multipart_upload(Bucket=server.bucket, Key=key, UploadId=upload_id)
    missing = server.expect(seaweedfs="NoSuchUpload", moto="500")
    part = partial(
        client.upload_part,
        Bucket=server.bucket,
        Key=key,
        UploadId=upload_id,
        PartNumber=2,
        Body=b"y",
    )
    assert _fails(part) == missing
    complete = partial(
        client.complete_multipart_upload,
        Bucket=server.bucket,
        Key=key,
        UploadId=upload_id,
        MultipartUpload={"Parts": _parts(etags)},
    )
    assert _fails(complete) == missing
    listed = partial(client.list_parts, Bucket=server.bucket, Key=key, UploadId=upload_id)
    assert _fails(listed) == "NoSuchUpload"
    assert object_keys(client, server.bucket, prefix) == []


def test_parts_below_the_minimum_size_are_refused(server: Server, prefix: str) -> None:
    client, key = server.client(), prefix + "small"
    upload_id, etags = _upload(client, server.bucket, key, b"1 byte is not 5 MiB", b"last")
    complete = partial(
        client.complete_multipart_upload,
        Bucket=server.bucket,
        Key=key,
        UploadId=upload_id,
        MultipartUpload={"Parts": _parts(etags)},
    )
    assert _fails(complete) == "EntityTooSmall"


# -- listing incomplete uploads --------------------------------------------------------------


def test_list_multipart_uploads_by_prefix_and_pages(server: Server, prefix: str) -> None:
    """boto3's paginator returns every upload under the prefix exactly once on both servers,
    but neither pages as AWS does: SeaweedFS lists by upload id (not key), sends no
    NextKeyMarker and treats KeyMarker as "this key only"; moto ignores MaxUploads, KeyMarker
    and UploadIdMarker and answers everything at once. moto's Initiated is a constant."""
    client = server.client()
    made = sorted(
        (prefix + f"in/k{i}", _upload(client, server.bucket, prefix + f"in/k{i}")[0])
        for i in range(4)
        for _ in range(2)
    )
    outside = _upload(client, server.bucket, prefix + "out/k0")[0]

    listed = incomplete_uploads(client, server.bucket, prefix + "in/")
    assert [(u.key, u.upload_id) for u in listed] == made
    assert outside not in [u.upload_id for u in listed]
    paged = [
        (u["Key"], u["UploadId"])
        for page in client.get_paginator("list_multipart_uploads").paginate(
            Bucket=server.bucket, Prefix=prefix + "in/", PaginationConfig={"PageSize": 3}
        )
        for u in page.get("Uploads", [])
    ]
    assert sorted(paged) == made  # each once

    first = client.list_multipart_uploads(Bucket=server.bucket, Prefix=prefix + "in/", MaxUploads=3)
    order = [(u["Key"], u["UploadId"]) for u in first.get("Uploads", [])]
    if server.name == "seaweedfs":
        assert first["IsTruncated"] is True
        assert first.get("NextKeyMarker") is None
        assert first["NextUploadIdMarker"] == order[-1][1]
        assert order == sorted(made, key=lambda u: u[1])[:3]  # by upload id
    else:
        assert first["IsTruncated"] is False
        assert sorted(order) == made  # all at once, grouped by key
        assert [k for k, _ in order] == sorted(k for k, _ in order)

    second_key = made[2][0]
    after = client.list_multipart_uploads(
        Bucket=server.bucket, Prefix=prefix + "in/", KeyMarker=second_key
    )
    keys_after = sorted(u["Key"] for u in after.get("Uploads", []))
    aws = sorted(k for k, _ in made if k > second_key)
    assert aws != keys_after  # neither server follows AWS here
    assert keys_after == server.expect(
        seaweedfs=[second_key, second_key], moto=sorted(k for k, _ in made)
    )

    initiated = {u.initiated for u in listed}
    if server.name == "seaweedfs":
        now = datetime.now(UTC)
        assert all(
            i is not None and now - timedelta(minutes=10) < i < now + timedelta(minutes=10)
            for i in initiated
        ), initiated
    else:
        assert initiated == {MOTO_INITIATED}


# -- single objects --------------------------------------------------------------------------


def test_put_object_conditions(server: Server, prefix: str) -> None:
    """If-None-Match: * and If-Match agree with AWS on both, except If-Match on a missing key
    (SeaweedFS 412, moto and AWS 404 NoSuchKey) and If-Match: * on an existing key (moto
    412, SeaweedFS and AWS: written)."""
    client, key = server.client(), prefix + "decision"
    put = client.put_object
    first = put(Bucket=server.bucket, Key=key, Body=b"1", IfNoneMatch="*")["ETag"]
    assert first == f'"{hashlib.md5(b"1").hexdigest()}"'  # noqa: S324
    assert _fails(lambda: put(Bucket=server.bucket, Key=key, Body=b"2", IfNoneMatch="*")) == (
        "PreconditionFailed"
    )
    second = put(Bucket=server.bucket, Key=key, Body=b"3", IfMatch=first)["ETag"]
    assert _fails(lambda: put(Bucket=server.bucket, Key=key, Body=b"4", IfMatch=first)) == (
        "PreconditionFailed"
    )
    assert client.get_object(Bucket=server.bucket, Key=key)["Body"].read() == b"3"

    missing = partial(put, Bucket=server.bucket, Key=key + ".missing", Body=b"5", IfMatch=second)
    assert _fails(missing) == server.expect(seaweedfs="PreconditionFailed", moto="NoSuchKey")
    star = partial(put, Bucket=server.bucket, Key=key, Body=b"6", IfMatch="*")
    if server.name == "seaweedfs":
        star()
        assert client.get_object(Bucket=server.bucket, Key=key)["Body"].read() == b"6"
    else:
        assert _fails(star) == "PreconditionFailed"
    assert object_keys(client, server.bucket, prefix) == [key]


def test_head_object_returns_user_metadata(server: Server, prefix: str) -> None:
    client, key = server.client(), prefix + "marker"
    client.put_object(
        Bucket=server.bucket, Key=key, Body=b"", Metadata={"DS-Query": "q1", "ds-epoch": "12"}
    )
    head = client.head_object(Bucket=server.bucket, Key=key)
    assert head["Metadata"] == {"ds-query": "q1", "ds-epoch": "12"}
    assert head["ContentLength"] == 0
    assert _fails(lambda: client.head_object(Bucket=server.bucket, Key=key + "x")) == "404"
    assert _fails(lambda: client.get_object(Bucket=server.bucket, Key=key + "x")) == "NoSuchKey"


def test_list_objects_v2_start_after_and_pages(server: Server, prefix: str) -> None:
    client = server.client()
    keys = [prefix + f"epoch-{i:04d}" for i in range(5)]
    for key in keys:
        client.put_object(Bucket=server.bucket, Key=key, Body=b"")
    listed = client.list_objects_v2(Bucket=server.bucket, Prefix=prefix, StartAfter=keys[2])
    assert [e["Key"] for e in listed["Contents"]] == keys[3:]
    beyond = client.list_objects_v2(Bucket=server.bucket, Prefix=prefix, StartAfter=keys[-1])
    assert beyond.get("Contents", []) == []
    paged = [
        e["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=server.bucket, Prefix=prefix, PaginationConfig={"PageSize": 2}
        )
        for e in page.get("Contents", [])
    ]
    assert paged == keys
    assert object_keys(client, server.bucket, prefix) == keys


# -- the bucket ------------------------------------------------------------------------------


def test_lifecycle_abort_incomplete_multipart_upload_round_trips(
    server: Server, unique: UniqueNames
) -> None:
    rules = [
        {
            "ID": "abort-stale-uploads",
            "Status": "Enabled",
            "Filter": {"Prefix": "datasets/"},
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 3},
        },
        {
            "ID": "expire-tmp",
            "Status": "Enabled",
            "Filter": {"Prefix": "tmp/"},
            "Expiration": {"Days": 1},
        },
    ]
    with temporary_bucket(server.endpoint, unique.token) as own:
        client = own.client()
        read = partial(client.get_bucket_lifecycle_configuration, Bucket=own.bucket)
        assert _fails(read) == "NoSuchLifecycleConfiguration"
        client.put_bucket_lifecycle_configuration(
            Bucket=own.bucket,
            LifecycleConfiguration={"Rules": rules},  # type: ignore[typeddict-item]
        )
        assert sorted(read()["Rules"], key=lambda r: r["ID"]) == rules
        client.delete_bucket_lifecycle(Bucket=own.bucket)
        assert _fails(read) == "NoSuchLifecycleConfiguration"


def test_missing_bucket(server: Server, unique: UniqueNames) -> None:
    """HeadBucket (404), ListObjectsV2 and GetBucketLifecycleConfiguration (NoSuchBucket) say
    the bucket is missing on both servers. But SeaweedFS creates the bucket on the first
    PutObject or CreateMultipartUpload by its admin identity (moto and AWS: NoSuchBucket;
    a limited identity gets AccessDenied on SeaweedFS, tests/testbed/test_s3_access.py)."""
    missing = f"ds-missing-{unique.token}"
    client = server.client()
    assert _fails(lambda: client.head_bucket(Bucket=missing)) == "404"
    assert _fails(lambda: client.list_objects_v2(Bucket=missing)) == "NoSuchBucket"
    lifecycle = partial(client.get_bucket_lifecycle_configuration, Bucket=missing)
    assert _fails(lifecycle) == "NoSuchBucket"
    put = partial(client.put_object, Bucket=missing, Key="k", Body=b"")
    create = partial(client.create_multipart_upload, Bucket=missing, Key="u")
    if server.name == "seaweedfs":
        try:
            put()
            client.head_bucket(Bucket=missing)  # created
            client.delete_object(Bucket=missing, Key="k")
            client.delete_bucket(Bucket=missing)
            upload_id = create()["UploadId"]  # created again
            client.abort_multipart_upload(Bucket=missing, Key="u", UploadId=upload_id)
        finally:
            with contextlib.suppress(ClientError):
                client.delete_object(Bucket=missing, Key="k")
            with contextlib.suppress(ClientError):
                client.delete_bucket(Bucket=missing)
    else:
        assert _fails(put) == "NoSuchBucket"
        assert _fails(create) == "NoSuchBucket"


def test_requests_must_be_signed(server: Server, prefix: str) -> None:
    """A wrong secret and an unknown key are refused (403) on both. Unsigned requests are
    refused too: 403 on SeaweedFS; on moto 403 for an existing object and 500 for anything
    else (its IAM check reads the missing Authorization header)."""
    client, key = server.client(), prefix + "private"
    client.put_object(Bucket=server.bucket, Key=key, Body=b"secret")
    wrong_secret = replace(server.endpoint, secret_access_key="wrong").client()
    assert _fails(lambda: wrong_secret.get_object(Bucket=server.bucket, Key=key)) == (
        "SignatureDoesNotMatch"
    )
    unknown = replace(server.endpoint, access_key_id="AKIAUNKNOWNUNKNOWN00").client()
    assert _fails(lambda: unknown.get_object(Bucket=server.bucket, Key=key)) == (
        "InvalidAccessKeyId"
    )

    def anonymous(path: str) -> int:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{server.endpoint.endpoint_url}/{path}", timeout=10)  # noqa: S310
        return refused.value.code

    assert anonymous(f"{server.bucket}/{key}") == 403
    assert anonymous(f"{server.bucket}?list-type=2") == server.expect(seaweedfs=403, moto=500)
