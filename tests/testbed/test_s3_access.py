"""Limited credentials (tests/support/s3_access.py) get real refusals from real servers: each
restriction a sink must detect at start (no write, no list, no ListMultipartUploads, no
AbortMultipartUpload, read-only) answers AccessDenied to exactly the refused calls, on
SeaweedFS and on moto, while the allowed calls and the test bed's own credentials keep
working.

Each test tries the same calls (`_outcomes`) and compares every answer at once, so a failure
shows the whole table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.conftest import UniqueNames
from tests.services import S3Endpoint
from tests.support.s3_access import READ_ONLY, S3Access, Server
from tests.support.s3_objects import delete_prefix, incomplete_uploads, temporary_bucket

#: The calls an S3 sink and store make, in the order they are tried.
CALLS = (
    "GetObject",
    "HeadObject",
    "ListObjectsV2",
    "HeadBucket",
    "PutObject",
    "CreateMultipartUpload",
    "UploadPart",
    "ListParts",
    "ListMultipartUploads",
    "CompleteMultipartUpload",
    "AbortMultipartUpload",
    "AbortUnknownUpload",
    "GetBucketLifecycleConfiguration",
    "DeleteObject",
)
#: SeaweedFS treats s3:PutObject as covering these too (AWS and moto: their own actions).
SEAWEEDFS_WRITE_COVERS = ("ListParts", "ListMultipartUploads", "AbortMultipartUpload")


@pytest.fixture(params=["s3", "moto"], ids=["seaweedfs", "moto"])
def server(request: pytest.FixtureRequest) -> Server:
    name: Server = request.param
    return name


@dataclass
class Scene:
    """What the calls act on, made with the test bed's own credentials."""

    admin: S3Endpoint
    prefix: str

    def __post_init__(self) -> None:
        client, bucket = self.admin.client(), self.admin.bucket
        self.object_key = self.prefix + "existing"
        client.put_object(Bucket=bucket, Key=self.object_key, Body=b"data")
        self.pending_key = self.prefix + "pending"
        self.pending = client.create_multipart_upload(Bucket=bucket, Key=self.pending_key)[
            "UploadId"
        ]
        client.upload_part(
            Bucket=bucket, Key=self.pending_key, UploadId=self.pending, PartNumber=1, Body=b"p"
        )
        self.ready_key = self.prefix + "ready"
        self.ready = client.create_multipart_upload(Bucket=bucket, Key=self.ready_key)["UploadId"]
        self.ready_etag = client.upload_part(
            Bucket=bucket, Key=self.ready_key, UploadId=self.ready, PartNumber=1, Body=b"r"
        )["ETag"]


@pytest.fixture
def scene(s3_access: S3Access, server: Server, unique: UniqueNames) -> Iterator[Scene]:
    admin = s3_access.admin(server)
    made = Scene(admin, unique.name("access") + "/")
    yield made
    delete_prefix(admin.client(), admin.bucket, made.prefix)


def _outcomes(limited: S3Endpoint, scene: Scene) -> dict[str, str]:
    """Each call of CALLS with `limited`'s credentials: "ok", "denied" (AccessDenied, or a
    bare 403 to a HEAD) or the error code."""
    client, bucket, p = limited.client(), limited.bucket, scene.prefix
    calls: dict[str, Callable[[], Any]] = {
        "GetObject": lambda: client.get_object(Bucket=bucket, Key=scene.object_key),
        "HeadObject": lambda: client.head_object(Bucket=bucket, Key=scene.object_key),
        "ListObjectsV2": lambda: client.list_objects_v2(Bucket=bucket, Prefix=p),
        "HeadBucket": lambda: client.head_bucket(Bucket=bucket),
        "PutObject": lambda: client.put_object(Bucket=bucket, Key=p + "new", Body=b"n"),
        "CreateMultipartUpload": lambda: client.create_multipart_upload(
            Bucket=bucket, Key=p + "new-upload"
        ),
        "UploadPart": lambda: client.upload_part(
            Bucket=bucket, Key=scene.pending_key, UploadId=scene.pending, PartNumber=2, Body=b"q"
        ),
        "ListParts": lambda: client.list_parts(
            Bucket=bucket, Key=scene.pending_key, UploadId=scene.pending
        ),
        "ListMultipartUploads": lambda: client.list_multipart_uploads(Bucket=bucket, Prefix=p),
        "CompleteMultipartUpload": lambda: client.complete_multipart_upload(
            Bucket=bucket,
            Key=scene.ready_key,
            UploadId=scene.ready,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": scene.ready_etag}]},
        ),
        "AbortMultipartUpload": lambda: client.abort_multipart_upload(
            Bucket=bucket, Key=scene.pending_key, UploadId=scene.pending
        ),
        # How a sink can probe the permission without an upload to lose: an allowed abort
        # of an upload id nobody issued answers NoSuchUpload, a refused one AccessDenied.
        "AbortUnknownUpload": lambda: client.abort_multipart_upload(
            Bucket=bucket, Key=p + "probe", UploadId="no-such-upload"
        ),
        "GetBucketLifecycleConfiguration": lambda: client.get_bucket_lifecycle_configuration(
            Bucket=bucket
        ),
        "DeleteObject": lambda: client.delete_object(Bucket=bucket, Key=scene.object_key),
    }
    assert tuple(calls) == CALLS
    outcomes = {}
    for name, call in calls.items():
        try:
            call()
            outcomes[name] = "ok"
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code") or str(
                exc.response["ResponseMetadata"]["HTTPStatusCode"]
            )
            outcomes[name] = {
                "AccessDenied": "denied",
                "403": "denied",
                # Allowed, and told what there is: no upload by that id, no lifecycle rules.
                "NoSuchUpload": "ok",
                "NoSuchLifecycleConfiguration": "ok",
            }.get(code, code)
    return outcomes


def _expect(denied: tuple[str, ...] | list[str]) -> dict[str, str]:
    return {call: "denied" if call in denied else "ok" for call in CALLS}


def test_no_write(s3_access: S3Access, server: Server, scene: Scene) -> None:
    limited = s3_access.endpoint(server, deny=["s3:PutObject"])
    denied = ["PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"]
    if server == "s3":
        denied += [*SEAWEEDFS_WRITE_COVERS, "AbortUnknownUpload"]
    assert _outcomes(limited, scene) == _expect(denied)


def test_read_only(s3_access: S3Access, server: Server, scene: Scene) -> None:
    limited = s3_access.endpoint(server, allow=READ_ONLY)
    allowed = ("GetObject", "HeadObject", "ListObjectsV2", "HeadBucket")
    assert _outcomes(limited, scene) == _expect([c for c in CALLS if c not in allowed])


def test_no_list(s3_access: S3Access, server: Server, scene: Scene) -> None:
    """s3:ListBucket covers ListObjectsV2 and HeadBucket (on moto through the alias the
    helper adds: moto asks for s3:HeadBucket)."""
    limited = s3_access.endpoint(server, deny=["s3:ListBucket"])
    assert _outcomes(limited, scene) == _expect(["ListObjectsV2", "HeadBucket"])


def test_no_list_multipart_uploads(s3_access: S3Access, server: Server, scene: Scene) -> None:
    limited = s3_access.endpoint(server, deny=["s3:ListBucketMultipartUploads"])
    assert _outcomes(limited, scene) == _expect(["ListMultipartUploads"])


def test_no_abort_multipart_upload(s3_access: S3Access, server: Server, scene: Scene) -> None:
    limited = s3_access.endpoint(server, deny=["s3:AbortMultipartUpload"])
    assert _outcomes(limited, scene) == _expect(["AbortMultipartUpload", "AbortUnknownUpload"])
    # The refused abort left the upload alone; the test bed's own credentials may abort it.
    admin = scene.admin.client()
    assert scene.pending in [
        u.upload_id for u in incomplete_uploads(admin, scene.admin.bucket, scene.prefix)
    ]
    admin.abort_multipart_upload(
        Bucket=scene.admin.bucket, Key=scene.pending_key, UploadId=scene.pending
    )


def test_no_lifecycle_read(s3_access: S3Access, server: Server, scene: Scene) -> None:
    limited = s3_access.endpoint(server, deny=["s3:GetLifecycleConfiguration"])
    assert _outcomes(limited, scene) == _expect(["GetBucketLifecycleConfiguration"])


def test_everything_allowed_is_allowed(s3_access: S3Access, server: Server, scene: Scene) -> None:
    """The default (s3:* on the bucket) and the test bed's own credentials, after limited
    users exist, may do every call."""
    s3_access.endpoint(server, deny=["s3:*"])
    assert _outcomes(s3_access.endpoint(server), scene) == _expect([])


def test_test_bed_credentials_keep_everything(
    s3_access: S3Access, server: Server, scene: Scene
) -> None:
    s3_access.endpoint(server, deny=["s3:*"])
    assert _outcomes(scene.admin, scene) == _expect([])


def test_limited_to_its_bucket(
    s3_access: S3Access, server: Server, scene: Scene, unique: UniqueNames
) -> None:
    """Credentials for another bucket may not touch the test bed's; a bucket that does not
    exist is refused as AccessDenied on SeaweedFS, NoSuchBucket on moto (which, like AWS,
    checks the policy and then finds no bucket)."""
    with temporary_bucket(scene.admin, unique.token) as other:
        limited = s3_access.endpoint(server, bucket=other.bucket)
        client = limited.client()
        client.put_object(Bucket=other.bucket, Key="mine", Body=b"")
        elsewhere = dict.fromkeys(CALLS, "denied")
        assert _outcomes(replace(limited, bucket=scene.admin.bucket), scene) == elsewhere
        client.delete_object(Bucket=other.bucket, Key="mine")
    missing = s3_access.endpoint(server, bucket=f"ds-missing-{unique.token}")
    with pytest.raises(ClientError) as refused:
        missing.client().put_object(Bucket=missing.bucket, Key="k", Body=b"")
    code = refused.value.response["Error"]["Code"]
    assert code == ("AccessDenied" if server == "s3" else "NoSuchBucket")


def test_revoked_credentials_are_refused(s3_access: S3Access, server: Server, scene: Scene) -> None:
    limited = s3_access.endpoint(server)
    limited.client().head_object(Bucket=limited.bucket, Key=scene.object_key)
    s3_access.revoke(limited)
    with pytest.raises(ClientError) as refused:
        limited.client().head_object(Bucket=limited.bucket, Key=scene.object_key)
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
