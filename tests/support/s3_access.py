"""Credentials that may do only some S3 actions on one bucket, made on a real server so a test
sees real refusals (AccessDenied) from it: a sink started with them must name the permission
it lacks.

Both test-bed servers evaluate IAM-style policies with S3's fine-grained action names
("s3:AbortMultipartUpload", "s3:ListBucketMultipartUploads", ...; Allow and Deny, resources
by bucket ARN), so every restriction works on either:

- SeaweedFS (`"s3"`): a managed policy (`s3.policy -put`) and a user holding it
  (`s3.configure -policies=...`), made with `weed shell` against the running server; the
  S3 gateway picks them up within a fraction of a second. The test bed's own credentials
  (an admin identity from its environment) stay allowed everything.
- moto (`"moto"`): a user, an inline policy and an access key made through moto's IAM API on
  the same port, signed by the test bed's admin user (tests/services/moto.py).

    def test_refuses_without_abort(s3_access: S3Access) -> None:
        limited = s3_access.endpoint(deny=["s3:AbortMultipartUpload"])     # on SeaweedFS
        read_only = s3_access.endpoint("moto", allow=READ_ONLY)            # on moto

Where the servers map actions differently from AWS (docs/testbed.md, "S3 servers compared"):
moto authorizes HeadBucket as "s3:HeadBucket" where AWS asks for "s3:ListBucket" (this module
adds the one to policies naming the other, on moto); SeaweedFS treats "s3:PutObject" as
covering ListParts, ListMultipartUploads and AbortMultipartUpload too (allowing it allows
those, denying it denies them).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from tests.services import S3Endpoint, Testbed, up
from tests.services.s3 import weed_binary

__all__ = ["EVERYTHING", "READ_ONLY", "S3Access", "Server", "policy_document"]

Server = Literal["s3", "moto"]
#: Every S3 action (the default of `allow`).
EVERYTHING = ("s3:*",)
#: Read objects and list them; nothing else (no write, no multipart upload management).
READ_ONLY = ("s3:GetObject", "s3:ListBucket")
#: moto checks these names where AWS checks the key: added beside the key, on moto only.
MOTO_ALIASES: dict[str, tuple[str, ...]] = {"s3:ListBucket": ("s3:HeadBucket",)}
#: How long a new access key may take to reach the S3 gateway (SeaweedFS: ~0.1 s).
KEY_PROPAGATION_TIMEOUT = 15.0


def policy_document(
    bucket: str,
    allow: Iterable[str] = EVERYTHING,
    deny: Iterable[str] = (),
    *,
    aliases: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, object]:
    """An IAM policy allowing `allow` and denying `deny` on `bucket` and its objects."""

    def expand(actions: Iterable[str]) -> list[str]:
        names: list[str] = []
        for action in actions:
            for name in (action, *(aliases or {}).get(action, ())):
                if name not in names:
                    names.append(name)
        return names

    resources = [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]
    allowed, denied = expand(allow), expand(deny)
    statements: list[dict[str, object]] = []
    if allowed:
        statements.append({"Effect": "Allow", "Action": allowed, "Resource": resources})
    if denied:
        statements.append({"Effect": "Deny", "Action": denied, "Resource": resources})
    return {"Version": "2012-10-17", "Statement": statements}


class _Users(Protocol):
    """Makes and deletes users of one server."""

    aliases: dict[str, tuple[str, ...]]

    def create(self, name: str, policy: dict[str, object]) -> tuple[str, str]: ...

    def delete(self, name: str) -> None: ...


class _MotoUsers:
    """Users, inline policies and access keys through moto's IAM API, as its admin."""

    def __init__(self, admin: S3Endpoint) -> None:
        import boto3

        self.aliases = MOTO_ALIASES
        self.iam = boto3.client(
            "iam",
            endpoint_url=admin.endpoint_url,
            region_name=admin.region,
            aws_access_key_id=admin.access_key_id,
            aws_secret_access_key=admin.secret_access_key,
        )

    def create(self, name: str, policy: dict[str, object]) -> tuple[str, str]:
        self.iam.create_user(UserName=name)
        self.iam.put_user_policy(
            UserName=name, PolicyName="limited", PolicyDocument=json.dumps(policy)
        )
        key = self.iam.create_access_key(UserName=name)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def delete(self, name: str) -> None:
        for key in self.iam.list_access_keys(UserName=name)["AccessKeyMetadata"]:
            self.iam.delete_access_key(UserName=name, AccessKeyId=key["AccessKeyId"])
        self.iam.delete_user_policy(UserName=name, PolicyName="limited")
        self.iam.delete_user(UserName=name)


class _SeaweedUsers:
    """A managed policy and an identity holding it, through `weed shell` (the S3 gateway's
    embedded IAM API is read-only in `weed mini`)."""

    def __init__(self, master_port: int) -> None:
        self.master = f"127.0.0.1:{master_port}"
        self.aliases: dict[str, tuple[str, ...]] = {}

    def _shell(self, commands: list[str]) -> str:
        done = subprocess.run(
            [str(weed_binary()), "shell", f"-master={self.master}"],
            input="\n".join(commands) + "\n",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        output = done.stdout + done.stderr
        if done.returncode != 0 or "error:" in output:
            raise RuntimeError(f"weed shell {commands} failed ({done.returncode}):\n{output}")
        return output

    def create(self, name: str, policy: dict[str, object]) -> tuple[str, str]:
        access_key = "DS" + secrets.token_hex(9).upper()
        secret_key = secrets.token_urlsafe(30)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(policy, f)
        try:
            # The identity names its policy from the start: it never exists without it.
            self._shell(
                [
                    f"s3.policy -put -name={name} -file={f.name}",
                    f"s3.configure -user={name} -access_key={access_key} "
                    f"-secret_key={secret_key} -policies={name} -apply",
                ]
            )
        finally:
            os.unlink(f.name)
        return access_key, secret_key

    def delete(self, name: str) -> None:
        self._shell(
            [f"s3.configure -user={name} -delete -apply", f"s3.policy -delete -name={name}"]
        )


@dataclass(frozen=True)
class _Made:
    users: _Users
    name: str
    endpoint: S3Endpoint


class S3Access:
    """Makes limited credentials on the test bed's S3 servers and deletes them at `close()`
    (the `s3_access` fixture does). Users are named `ds-limited-<random>`."""

    def __init__(self, testbed: Testbed) -> None:
        self.testbed = testbed
        self._users: dict[Server, _Users] = {}
        self._made: list[_Made] = []

    def admin(self, server: Server = "s3") -> S3Endpoint:
        """The server's own endpoint (the test bed's credentials: allowed everything)."""
        up([server], self.testbed)
        return self.testbed.s3.endpoint() if server == "s3" else self.testbed.moto.endpoint()

    def _users_of(self, server: Server) -> _Users:
        if server not in self._users:
            admin = self.admin(server)
            self._users[server] = (
                _SeaweedUsers(self.testbed.layout.s3.master)
                if server == "s3"
                else _MotoUsers(admin)
            )
        return self._users[server]

    def endpoint(
        self,
        server: Server = "s3",
        *,
        allow: Iterable[str] = EVERYTHING,
        deny: Iterable[str] = (),
        bucket: str | None = None,
    ) -> S3Endpoint:
        """An endpoint of `server` whose credentials may do the actions in `allow` (IAM
        names, wildcards as in IAM: "s3:*", "s3:Get*") except those in `deny`, on `bucket`
        (default: the test bed's) and its objects, and nothing anywhere else."""
        if server not in ("s3", "moto"):
            raise ValueError(f"server {server!r}: choose 's3' (SeaweedFS) or 'moto'")
        admin = self.admin(server)
        users = self._users_of(server)
        bucket = bucket or admin.bucket
        name = f"ds-limited-{uuid.uuid4().hex[:12]}"
        policy = policy_document(bucket, list(allow), list(deny), aliases=users.aliases)
        access_key, secret_key = users.create(name, policy)
        limited = replace(
            admin, access_key_id=access_key, secret_access_key=secret_key, bucket=bucket
        )
        self._made.append(_Made(users, name, limited))
        _wait_until_known(limited)
        return limited

    def revoke(self, endpoint: S3Endpoint) -> None:
        """Delete the user behind `endpoint` now (its key stops working)."""
        for made in [m for m in self._made if m.endpoint == endpoint]:
            made.users.delete(made.name)
            self._made.remove(made)

    def close(self) -> None:
        errors = []
        for made in reversed(self._made):
            try:
                made.users.delete(made.name)
            except Exception as exc:  # noqa: BLE001 (every user is tried; errors re-raised below)
                errors.append(f"{made.name}: {exc}")
        self._made.clear()
        if errors:
            raise RuntimeError("could not delete limited S3 users:\n" + "\n".join(errors))


def _wait_until_known(endpoint: S3Endpoint) -> None:
    """Until the server knows the new key: any answer but InvalidAccessKeyId will do (what
    the policy allows is the test's business)."""
    from botocore.exceptions import ClientError

    client = endpoint.client()
    deadline = time.monotonic() + KEY_PROPAGATION_TIMEOUT
    while True:
        try:
            client.get_object(Bucket=endpoint.bucket, Key=f"_testbed/no-such-key-{uuid.uuid4()}")
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code not in ("InvalidAccessKeyId", "SignatureDoesNotMatch"):
                return
        else:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{endpoint.endpoint_url} still refuses the new key {endpoint.access_key_id} "
                f"after {KEY_PROPAGATION_TIMEOUT:.0f} s"
            )
        time.sleep(0.05)
