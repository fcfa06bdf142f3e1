"""What the S3 sink checks against the server before a job writes: the prefix belongs to this
job, the highest committed epoch (without listing the whole history), and at start every
permission and server feature the protocol needs, each refusal with its fix:

- the bucket answers and the job may write, read and delete under the prefix;
- multipart uploads can be started, listed (ListMultipartUploads: recovery) and aborted
  (AbortMultipartUpload: rollback);
- the server honours `If-None-Match: *` (create-only commits and markers);
- no lifecycle rule aborts incomplete uploads under the prefix sooner than
  `recovery_window_s` (it could destroy an in-doubt epoch's data).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durable_sinks.clients.s3 import error_code, is_missing, is_precondition_failed
from durable_sinks.core.errors import ConfigError, DurableSinkError
from durable_sinks.core.formats import stored_format
from durable_sinks.core.joblog import JobLogger

from .config import DAY_S, S3
from .layout import Layout

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

JOB_FILE = stored_format(
    "S3 job file",
    current=1,
    oldest=1,
    where='`<prefix>/_job.json`: JSON `{"job_id": ..., "sink": ..., "version": ...}`',
)

Failure = Callable[[BaseException, str], DurableSinkError]


def claim_prefix(client: S3Client, layout: Layout, job_id: str, sink: str, fail: Failure) -> None:
    """Make `<prefix>/_job.json` name this job and sink (created at the first start), or
    refuse with ConfigError when another job or sink owns the prefix: two jobs under one
    prefix would roll back each other's uploads. First the bucket must exist (some servers
    create a missing bucket on the first PUT: durable-sinks never creates one)."""
    try:
        client.list_objects_v2(Bucket=layout.bucket, Prefix=layout.location.folder, MaxKeys=1)
    except Exception as exc:
        if error_code(exc) in ("404", "NoSuchBucket", "NotFound"):
            raise ConfigError(
                f"bucket {layout.bucket!r} does not exist (NoSuchBucket)",
                job=job_id,
                sink=sink,
                fix="create the bucket first (durable-sinks never creates buckets), or fix the "
                "bucket in the path",
            ) from exc
        raise fail(exc, f"reach bucket {layout.bucket} (s3:ListBucket)") from exc
    owner = {"job_id": job_id, "sink": sink}
    key = layout.owner_key
    where = f"s3://{layout.bucket}/{key}"
    try:
        client.put_object(
            Bucket=layout.bucket,
            Key=key,
            Body=json.dumps({**owner, "version": JOB_FILE.current}, sort_keys=True).encode(),
            ContentType="application/json",
            IfNoneMatch="*",
        )
    except Exception as exc:
        if not is_precondition_failed(exc):
            raise fail(exc, f"create {where}") from exc
    else:
        return
    try:
        found = json.loads(client.get_object(Bucket=layout.bucket, Key=key)["Body"].read())
    except Exception as exc:
        raise fail(exc, f"read {where}") from exc
    if not isinstance(found, dict) or {k: found.get(k) for k in owner} != owner:
        shown = found if isinstance(found, dict) else "unreadable"
        raise ConfigError(
            f"s3://{layout.bucket}/{layout.location.prefix} belongs to {shown} (its {where}), "
            f"not to job {job_id!r} sink {sink!r}",
            job=job_id,
            sink=sink,
            fix="give each job's S3 sink its own path; a job renamed on purpose needs a new "
            "path too",
        )
    JOB_FILE.check(found.get("version"), source=where, job=job_id, sink=sink)


#: Seconds a successful check_bucket of one location and settings is trusted in a process:
#: a job restarted by its driver (a ride-out, a recovery) does not probe again each time.
CHECK_TTL_S = 300.0
_passed: dict[tuple[S3, str], float] = {}


def check_bucket(client: S3Client, layout: Layout, config: S3, job_id: str, fail: Failure) -> None:
    """Every permission and feature the sink uses, tried under `<prefix>/_durable/` (once
    per CHECK_TTL_S per process, location and settings)."""
    key = (config, job_id)
    if time.monotonic() - _passed.get(key, -CHECK_TTL_S) < CHECK_TTL_S:
        return
    _probe(client, layout, config, job_id, fail)
    _passed[key] = time.monotonic()


def _probe(client: S3Client, layout: Layout, config: S3, job_id: str, fail: Failure) -> None:
    folder = layout.probe_folder
    where = f"s3://{layout.bucket}/{folder}"
    probe = f"{folder}probe-{uuid.uuid4().hex}"
    try:
        client.put_object(Bucket=layout.bucket, Key=probe, Body=b"1", IfNoneMatch="*")
    except Exception as exc:
        raise fail(exc, f"write a probe object under {where} (s3:PutObject)") from exc
    try:
        try:
            client.put_object(Bucket=layout.bucket, Key=probe, Body=b"2", IfNoneMatch="*")
        except Exception as exc:
            if not is_precondition_failed(exc):
                raise fail(exc, f"write a probe object under {where}") from exc
        else:
            raise ConfigError(
                f"the S3 server at {config.connection.server()} ignores If-None-Match: a "
                "second create-only PUT of one key overwrote it, so a replayed commit could "
                "overwrite an epoch's objects",
                job=job_id,
                sink=config.name,
                fix="use an S3 server with conditional writes (AWS S3, or a recent MinIO, "
                "SeaweedFS, Ceph RGW): docs/s3.md",
            )
        try:
            client.get_object(Bucket=layout.bucket, Key=probe)["Body"].read()
        except Exception as exc:
            raise fail(exc, f"read a probe object under {where} (s3:GetObject)") from exc
    finally:
        try:
            client.delete_object(Bucket=layout.bucket, Key=probe)
        except Exception as exc:
            raise fail(exc, f"delete a probe object under {where} (s3:DeleteObject)") from exc
    _check_multipart(client, layout, folder, fail)
    _check_lifecycle(client, layout, config, job_id, fail)


def _check_multipart(client: S3Client, layout: Layout, folder: str, fail: Failure) -> None:
    where = f"s3://{layout.bucket}/{folder}"
    key = f"{folder}probe-{uuid.uuid4().hex}.parquet"
    try:
        upload_id = client.create_multipart_upload(Bucket=layout.bucket, Key=key)["UploadId"]
    except Exception as exc:
        raise fail(exc, f"start a multipart upload under {where} (s3:PutObject)") from exc
    try:
        try:
            listed = client.list_multipart_uploads(Bucket=layout.bucket, Prefix=folder)
        except Exception as exc:
            raise fail(
                exc,
                f"list multipart uploads under {where} (s3:ListBucketMultipartUploads, "
                "which recovery needs)",
            ) from exc
        if not any(u.get("UploadId") == upload_id for u in listed.get("Uploads", [])):
            raise ConfigError(
                f"ListMultipartUploads under {where} does not show the upload just started",
                sink=layout.location.prefix,
                fix="recovery finds leftovers by listing uploads: use a server that lists them",
            )
    finally:
        try:
            client.abort_multipart_upload(Bucket=layout.bucket, Key=key, UploadId=upload_id)
        except Exception as exc:
            if not is_missing(exc):
                raise fail(
                    exc,
                    f"abort a multipart upload under {where} (s3:AbortMultipartUpload, which "
                    "rollback needs)",
                ) from exc


def _check_lifecycle(
    client: S3Client, layout: Layout, config: S3, job_id: str, fail: Failure
) -> None:
    try:
        rules = client.get_bucket_lifecycle_configuration(Bucket=layout.bucket).get("Rules", [])
    except Exception as exc:
        code = error_code(exc)
        if code == "NoSuchLifecycleConfiguration":
            return
        if code in ("AccessDenied", "NotImplemented", "501"):
            JobLogger(job_id, config.name, component="sinks.s3").warning(
                "cannot read the lifecycle rules of bucket %s (%s): make sure none aborts "
                "incomplete multipart uploads under %s sooner than %g days (recovery_window_s)",
                layout.bucket,
                code,
                layout.location.prefix,
                config.recovery_window_s / DAY_S,
            )
            return
        raise fail(exc, f"read the lifecycle rules of bucket {layout.bucket}") from exc
    for rule in rules:
        days = _abort_days(rule, layout.location.folder)
        window_days = config.recovery_window_s / DAY_S
        if days is not None and days < window_days:
            raise ConfigError(
                f"bucket {layout.bucket}'s lifecycle rule {rule.get('ID', '(no id)')!r} aborts "
                f"incomplete multipart uploads under {layout.location.prefix!r} after {days} "
                f"day(s), sooner than recovery_window_s={config.recovery_window_s:g} "
                f"({window_days:g} days): an "
                "epoch left in doubt by a stopped job would lose its data",
                job=job_id,
                sink=config.name,
                fix=f"raise the rule's DaysAfterInitiation to >= {math.ceil(window_days)}, "
                "exclude this prefix from it, or lower recovery_window_s to how long the "
                "job may stay stopped",
            )


def _abort_days(rule: Any, folder: str) -> int | None:
    """Days after which `rule` aborts incomplete uploads under `folder`, if it applies."""
    if rule.get("Status") != "Enabled":
        return None
    days = (rule.get("AbortIncompleteMultipartUpload") or {}).get("DaysAfterInitiation")
    if days is None:
        return None
    rule_filter = rule.get("Filter")
    if rule_filter is None:
        prefix = rule.get("Prefix", "")
    elif "And" in rule_filter:
        if rule_filter["And"].get("Tags"):
            return None  # uploads carry no tags
        prefix = rule_filter["And"].get("Prefix", "")
    elif "Tag" in rule_filter:
        return None
    else:
        prefix = rule_filter.get("Prefix", "")
    applies = folder.startswith(prefix) or prefix.startswith(folder)
    return int(days) if applies else None
