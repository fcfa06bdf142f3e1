"""The S3 fault hooks (tests/support/s3_faults.py) do what they say, on the very client the S3
sink and store share (`S3Connection(...).client()`), against SeaweedFS: conditions stripped,
requests failed before or after the server handled them, retried by botocore as real
failures are, counted; and gone when the block ends."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError

from durable_sinks.clients.s3 import S3Connection
from tests.services import S3Endpoint
from tests.support.s3_faults import (
    ErrorResponse,
    count_requests,
    fail_request,
    without_conditional_writes,
)
from tests.support.s3_objects import incomplete_uploads, object_keys


def _connection(s3: S3Endpoint) -> S3Connection:
    """The settings a sink under test would be given."""
    return S3Connection(
        endpoint_url=s3.endpoint_url,
        region=s3.region,
        access_key_id=s3.access_key_id,
        secret_access_key=s3.secret_access_key,
        addressing_style="path",
    )


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code"))


def test_the_sinks_client_is_shared(s3: S3Endpoint) -> None:
    """Hooks on a client built from equal settings reach the sink's own client."""
    assert _connection(s3).client() is _connection(s3).client()


def test_without_conditional_writes(s3: S3Endpoint, s3_prefix: str) -> None:
    client, key = _connection(s3).client(), s3_prefix + "decision"
    client.put_object(Bucket=s3.bucket, Key=key, Body=b"first", IfNoneMatch="*")
    stale = client.head_object(Bucket=s3.bucket, Key=key)["ETag"]
    with without_conditional_writes(client) as dropped:
        client.put_object(Bucket=s3.bucket, Key=key, Body=b"second", IfNoneMatch="*")
        client.put_object(Bucket=s3.bucket, Key=key, Body=b"third", IfMatch=stale)
        upload_id = client.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
        etag = client.upload_part(
            Bucket=s3.bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"fourth"
        )["ETag"]
        client.complete_multipart_upload(
            Bucket=s3.bucket,
            Key=key,
            UploadId=upload_id,
            IfNoneMatch="*",
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
        )
        client.put_object(Bucket=s3.bucket, Key=key + ".plain", Body=b"")  # no condition
    assert dropped == ["PutObject", "PutObject", "CompleteMultipartUpload"]
    assert client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"fourth"
    with pytest.raises(ClientError) as refused:  # conditions work again after the block
        client.put_object(Bucket=s3.bucket, Key=key, Body=b"fifth", IfNoneMatch="*")
    assert _code(refused.value) == "PreconditionFailed"


def test_a_request_that_never_arrives(s3: S3Endpoint, s3_prefix: str) -> None:
    """Every attempt fails: the caller sees the error after botocore's 4 attempts
    (`retries={"max_attempts": 3}` means 3 retries to botocore), and the server saw nothing."""
    client, key = _connection(s3).client(), s3_prefix + "lost"
    with (
        fail_request(client, "PutObject", ConnectionClosedError, times=None) as failed,
        pytest.raises(ConnectionClosedError),
    ):
        client.put_object(Bucket=s3.bucket, Key=key, Body=b"x")
    assert (failed.attempts, failed.failed) == (4, 4)
    assert object_keys(client, s3.bucket, s3_prefix) == []


def test_one_failed_attempt_is_retried_by_botocore(s3: S3Endpoint, s3_prefix: str) -> None:
    client, key = _connection(s3).client(), s3_prefix + "retried"
    with fail_request(client, "PutObject", EndpointConnectionError) as failed:
        answer = client.put_object(Bucket=s3.bucket, Key=key, Body=b"x")
    assert answer["ResponseMetadata"]["RetryAttempts"] == 1
    assert (failed.attempts, failed.failed) == (2, 1)
    assert object_keys(client, s3.bucket, s3_prefix) == [key]


def test_the_nth_call_fails(s3: S3Endpoint, s3_prefix: str) -> None:
    client = _connection(s3).client()
    with fail_request(client, "PutObject", ConnectionClosedError, nth=2, times=None):
        client.put_object(Bucket=s3.bucket, Key=s3_prefix + "1", Body=b"")
        with pytest.raises(ConnectionClosedError):
            client.put_object(Bucket=s3.bucket, Key=s3_prefix + "2", Body=b"")
        client.head_object(Bucket=s3.bucket, Key=s3_prefix + "1")  # other operations pass
    client.put_object(Bucket=s3.bucket, Key=s3_prefix + "3", Body=b"")  # hook gone
    assert object_keys(client, s3.bucket, s3_prefix) == [s3_prefix + "1", s3_prefix + "3"]


def test_completed_upload_whose_answer_was_lost(s3: S3Endpoint, s3_prefix: str) -> None:
    """sent=True: the server completes the upload, the caller sees a dropped connection; and
    with one lost answer botocore's retry of a conditional complete meets the object that
    very upload made (on SeaweedFS: 412)."""
    client = _connection(s3).client()

    def upload(key: str) -> tuple[str, str]:
        upload_id = client.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
        etag = client.upload_part(
            Bucket=s3.bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"data"
        )["ETag"]
        return upload_id, etag

    def complete(key: str, upload_id: str, etag: str) -> None:
        client.complete_multipart_upload(
            Bucket=s3.bucket,
            Key=key,
            UploadId=upload_id,
            IfNoneMatch="*",
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
        )

    key = s3_prefix + "ambiguous"
    upload_id, etag = upload(key)
    with (
        fail_request(
            client, "CompleteMultipartUpload", ConnectionClosedError, times=None, sent=True
        ),
        pytest.raises(ConnectionClosedError),
    ):
        complete(key, upload_id, etag)
    assert client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"data"
    assert incomplete_uploads(client, s3.bucket, s3_prefix) == []

    key = s3_prefix + "retried"
    upload_id, etag = upload(key)
    with (
        fail_request(client, "CompleteMultipartUpload", ConnectionClosedError, sent=True),
        pytest.raises(ClientError) as own_object,
    ):
        complete(key, upload_id, etag)
    assert _code(own_object.value) == "PreconditionFailed"
    assert client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == b"data"


def test_error_answers(s3: S3Endpoint, s3_prefix: str) -> None:
    """An injected SlowDown is retried like a real one; one that persists reaches the caller
    as a ClientError with its code and status."""
    client = _connection(s3).client()
    with fail_request(client, "PutObject", ErrorResponse("SlowDown", 503)) as failed:
        client.put_object(Bucket=s3.bucket, Key=s3_prefix + "slow", Body=b"")
    assert failed.failed == 1
    with (
        fail_request(client, "PutObject", ErrorResponse("InternalError", 500), times=None),
        pytest.raises(ClientError) as raised,
    ):
        client.put_object(Bucket=s3.bucket, Key=s3_prefix + "broken", Body=b"")
    assert _code(raised.value) == "InternalError"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert object_keys(client, s3.bucket, s3_prefix) == [s3_prefix + "slow"]


def test_count_requests(s3: S3Endpoint, s3_prefix: str) -> None:
    client = _connection(s3).client()
    with count_requests(client) as counts:
        client.put_object(Bucket=s3.bucket, Key=s3_prefix + "a", Body=b"")
        with fail_request(client, "PutObject", ConnectionClosedError):
            client.put_object(Bucket=s3.bucket, Key=s3_prefix + "b", Body=b"")
        client.list_objects_v2(Bucket=s3.bucket, Prefix=s3_prefix)
    client.head_object(Bucket=s3.bucket, Key=s3_prefix + "a")  # after the block: not counted
    assert counts.calls == {"PutObject": 2, "ListObjectsV2": 1}
    assert counts.sent == {"PutObject": 3, "ListObjectsV2": 1}
    assert counts.total() == 3


def test_arguments_are_checked(s3: S3Endpoint) -> None:
    client = _connection(s3).client()
    with (
        pytest.raises(ValueError, match="count from 1"),
        fail_request(client, "PutObject", ConnectionClosedError, nth=0),
    ):
        pass
