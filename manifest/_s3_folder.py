"""A job's folder in the S3 decision store: the requests the store makes (conditional writes,
listings from an epoch on, hints, batch deletes), each failure translated into a typed error
that names the store and the key. What the objects mean is the store's (manifest/s3.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from durable_sinks.clients.s3 import (
    S3Connection,
    S3Location,
    conditional_write_problem,
    error_code,
    is_missing,
    is_precondition_failed,
    s3_failure,
)
from durable_sinks.core.errors import ConfigError, DurableSinkError, ManifestError
from durable_sinks.core.operations import Bookkeeping

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

WIDTH = 12  # digits of epoch numbers in keys (sortable)
#: Hints are rewritten when they are this many epochs behind (a listing page holds 1,000).
HINT_EVERY = 100
#: What a failed request raises (botocore's; the store translates them).
REQUEST_ERRORS = (ClientError, BotoCoreError)


class S3Folder:
    """`<location>/<home>` in a bucket, reached through `connection`, for `job`'s store
    (`where`: whose store it is, for messages)."""

    def __init__(
        self,
        location: S3Location,
        connection: S3Connection,
        home: str,
        *,
        where: str,
        job: str | None,
    ) -> None:
        self.location = location
        self.connection = connection
        self.home = home
        self.where = where
        self.job = job

    def client(self) -> S3Client:
        return self.connection.client()

    def key(self, *parts: str) -> str:
        return "/".join((self.home, *parts))

    def uri(self, key: str) -> str:
        return f"s3://{self.location.bucket}/{key}"

    def failure(self, exc: Exception, action: str, epoch: int | None = None) -> DurableSinkError:
        """The typed error for a failed request (`action`: what was attempted)."""
        error = s3_failure(
            exc, f"{action} ({self.where})", self.connection, job=self.job, epoch=epoch
        )
        if type(error) is DurableSinkError:  # a refusal s3_failure has no class for
            return ManifestError(
                error.message,
                job=error.job,
                epoch=epoch,
                fix=error.fix
                or f"check {self.where} at {self.location} and the job's permissions there "
                "(docs/s3.md)",
            )
        return error

    # -- objects -------------------------------------------------------------------------------
    def read(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag, None if it does not exist (errors as botocore's)."""
        try:
            response = self.client().get_object(Bucket=self.location.bucket, Key=key)
        except ClientError as exc:
            if is_missing(exc):
                return None
            raise
        return response["Body"].read(), response["ETag"]

    def write(self, key: str, body: bytes, *, replacing: str | None) -> str | None:
        """PUT `body` if the key does not exist (`replacing` None) or still has the ETag
        `replacing`; the new ETag, or None when that condition failed (another writer came
        first). Other errors as botocore raised them."""
        client, bucket = self.client(), self.location.bucket
        try:
            if replacing is None:
                response = client.put_object(
                    Bucket=bucket,
                    Key=key,
                    Body=body,
                    IfNoneMatch="*",
                    ContentType="application/json",
                )
            else:
                response = client.put_object(
                    Bucket=bucket,
                    Key=key,
                    Body=body,
                    IfMatch=replacing,
                    ContentType="application/json",
                )
        except ClientError as exc:
            # AWS answers If-Match on a key deleted meanwhile with 404 (SeaweedFS with 412).
            if is_precondition_failed(exc) or (replacing is not None and is_missing(exc)):
                return None
            raise
        return response["ETag"]

    def mark(self, key: str, epoch: int) -> None:
        """Create (or overwrite) an empty marker object."""
        try:
            self.client().put_object(Bucket=self.location.bucket, Key=key, Body=b"")
        except REQUEST_ERRORS as exc:
            raise self.failure(exc, f"write {self.uri(key)}", epoch) from None

    def exists(self, key: str, epoch: int) -> bool:
        try:
            self.client().head_object(Bucket=self.location.bucket, Key=key)
        except ClientError as exc:
            if is_missing(exc):
                return False
            raise self.failure(exc, f"read {self.uri(key)}", epoch) from None
        except BotoCoreError as exc:
            raise self.failure(exc, f"read {self.uri(key)}", epoch) from None
        return True

    def delete(self, keys: list[str]) -> None:
        """Delete `keys`, up to 1,000 per request."""
        for first in range(0, len(keys), 1000):
            batch = keys[first : first + 1000]
            try:
                response = self.client().delete_objects(
                    Bucket=self.location.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
            except REQUEST_ERRORS as exc:
                raise self.failure(exc, f"delete old decisions under {self.location}") from None
            errors = response.get("Errors", [])
            if errors:
                raise ManifestError(
                    f"{self.where}: S3 refused to delete {len(errors)} old decision objects "
                    f"(first: {errors[0].get('Key')}: {errors[0].get('Code')})",
                    job=self.job,
                    fix="grant s3:DeleteObject on the store's prefix (docs/s3.md)",
                )

    def drop(self, *, apply: bool) -> list[Bookkeeping]:
        """Every object under `<home>/` (the job's folder): counted, and with `apply`
        deleted, each key checked to lie there first."""
        prefix = self.key("")
        keys: list[str] = []
        token: str | None = None
        while True:
            request: dict[str, Any] = {"Bucket": self.location.bucket, "Prefix": prefix}
            if token is not None:
                request["ContinuationToken"] = token
            try:
                page = self.client().list_objects_v2(**request)
            except REQUEST_ERRORS as exc:
                raise self.failure(exc, f"list {self.uri(prefix)}") from None
            keys += [
                k for item in page.get("Contents", []) if _inside(k := item.get("Key", ""), prefix)
            ]
            if not page.get("IsTruncated"):
                break
            token = page.get("NextContinuationToken")
        if not keys:
            return []
        if apply:
            self.delete(keys)
        return [Bookkeeping("decision store objects", self.uri(prefix), len(keys))]

    # -- hints and listings --------------------------------------------------------------------
    def refresh_hint(self, name: str, value: int, hinted: int | None) -> int | None:
        """Rewrite hint `name` with `value` when what it holds (`hinted`, as far as known) is
        unknown or HINT_EVERY behind; what it holds afterwards. Best effort: a lost hint
        only costs a longer listing later."""
        if hinted is not None and value < hinted + HINT_EVERY:
            return hinted
        try:
            self.client().put_object(
                Bucket=self.location.bucket, Key=self.key(name), Body=str(value).encode()
            )
        except REQUEST_ERRORS:
            return hinted
        return value

    def read_hint(self, name: str) -> int | None:
        try:
            found = self.read(self.key(name))
        except REQUEST_ERRORS as exc:
            raise self.failure(exc, f"read {self.uri(self.key(name))}") from None
        if found is None:
            return None
        try:
            return int(found[0])
        except ValueError:
            return None  # a damaged hint is only a hint: recomputed

    def listed(self, folder: str, start: int | None) -> Iterator[tuple[int, int]]:
        """(epoch, size) of the objects in `folder`, ascending, from epoch `start` (all
        when None): one request per 1,000 objects, stopped whenever the caller stops."""
        prefix = self.key(folder) + "/"
        token: str | None = None
        while True:
            request: dict[str, Any] = {"Bucket": self.location.bucket, "Prefix": prefix}
            if token is not None:
                request["ContinuationToken"] = token
            elif start is not None and start > 0:
                # Just after every key of epoch start-1 ('~' sorts after '.' and digits).
                request["StartAfter"] = f"{prefix}{start - 1:0{WIDTH}d}~"
            try:
                page = self.client().list_objects_v2(**request)
            except REQUEST_ERRORS as exc:
                raise self.failure(exc, f"list {self.uri(prefix)}") from None
            for item in page.get("Contents", []):
                name = item["Key"][len(prefix) :].removesuffix(".json")
                if name.isdigit():
                    yield int(name), int(item.get("Size", 0))
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    # -- the server ----------------------------------------------------------------------------
    def check_server(self) -> None:
        """ConfigError unless the bucket exists and is reachable with these settings, and the
        server honours conditional writes (without them two coordinators could both
        decide)."""
        bucket = self.location.bucket
        try:
            # Some servers (SeaweedFS) create a missing bucket on the first PUT. A listing (not
            # HEAD, whose answers have no body) says why it is refused.
            self.client().list_objects_v2(Bucket=bucket, Prefix=self.key(""), MaxKeys=1)
        except ClientError as exc:
            if error_code(exc) not in ("404", "NoSuchBucket"):
                raise self.failure(exc, f"reach the bucket {bucket!r}") from None
            raise ConfigError(
                f"{self.where}: the bucket {bucket!r} does not exist at "
                f"{self.connection.server()} (NoSuchBucket)",
                job=self.job,
                fix="create the bucket first (durable-sinks never creates buckets), or fix "
                f"the bucket in {self.location}",
            ) from None
        except BotoCoreError as exc:
            raise self.failure(exc, f"reach the bucket {bucket!r}") from None
        try:
            problem = conditional_write_problem(self.client(), bucket, self.key(""))
        except REQUEST_ERRORS as exc:
            raise self.failure(exc, f"write a probe object under {self.location}") from None
        if problem is not None:
            raise ConfigError(
                f"{self.where}: S3 at {self.connection.server()} does not honour conditional "
                f"writes: {problem}. Without them a zombie coordinator could record a decision "
                "after a newer one took over, so this store is not safe there",
                job=self.job,
                fix="use a server that implements If-None-Match and If-Match on PUT (AWS S3, "
                "SeaweedFS 4, MinIO from 2025-09; a proxy in between must pass those headers), "
                "or put the decision store elsewhere (decision_store='postgresql://...' or a "
                "durable directory)",
            )


def _inside(key: str, folder: str) -> bool:
    """Whether a listed `key` lies in `folder` (no `..` step out of it)."""
    rest = key[len(folder) :] if key.startswith(folder) else ""
    return bool(rest) and ".." not in rest.split("/")
