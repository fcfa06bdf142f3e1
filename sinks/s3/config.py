"""The S3 sink's configuration, `durable_sinks.S3`: a frozen, picklable dataclass checked
when it is built (on the driver, before anything connects). Importing it loads no client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from durable_sinks.clients.s3 import (
    DEFAULT_REQUEST_ATTEMPTS,
    MAX_OBJECT_SIZE,
    MAX_PART_SIZE,
    MAX_PARTS,
    MIN_PART_SIZE,
    AddressingStyle,
    S3Connection,
    S3Location,
    connection_of,
)
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.naming import check_sink_name
from durable_sinks.core.settings import apply_conveniences

COMPRESSIONS = ("none", "snappy", "gzip", "zstd", "lz4", "brotli")
MiB = 1024 * 1024
DAY_S = 86_400.0


@dataclass(frozen=True)
class S3:
    """An S3 prefix (AWS or an S3-compatible server) as a sink of Parquet objects:
    `durable_sink(S3(path="s3://lake/events"), job_id="orders", ...)`.

    Each epoch's objects are multipart uploads, completed after the job's decision; an
    epoch manifest (`_epochs/<n>.json`) marks the epoch committed, and readers trust only
    epochs that have one (docs/s3.md). Frozen and picklable; checked when built, on the
    driver, before anything connects.
    """

    kind: ClassVar[str] = "s3"

    path: str
    """`s3://bucket/prefix` (or `s3a://`): the dataset's folder. The bucket must exist; one job
    and sink per prefix. Layout: `epoch=<12
    digits>/part-<part>_g<generation>a<attempt>_<n>.parquet`, markers `_epochs/<epoch>.json`.
    Required."""
    name: str = "s3"
    """The sink's name within the job. Default "s3"."""
    endpoint_url: str | None = None
    """An S3-compatible server, `http(s)://host:port`. Default: `AWS_ENDPOINT_URL_S3` /
    `AWS_ENDPOINT_URL`, else AWS."""
    region: str | None = None
    """The bucket's region. Default: boto3's (`AWS_REGION`, ~/.aws)."""
    access_key_id: str | None = field(default=None, repr=False)
    """Credentials, with `secret_access_key` and `session_token`; may be `${env:NAME}` /
    `${file:/path}` references, and never appear in logs, errors, handles, markers or reprs.
    Default: boto3's chain (environment, ~/.aws, an instance or pod role)."""
    secret_access_key: str | None = field(default=None, repr=False)
    """See `access_key_id`."""
    session_token: str | None = field(default=None, repr=False)
    """See `access_key_id`."""
    addressing_style: AddressingStyle = "auto"
    """`"path"` for most S3-compatible servers, `"virtual"` to force host-style. Default
    `"auto"`."""
    connect_timeout_s: float = 10.0
    """Seconds a connection attempt may take. Default 10."""
    request_timeout_s: float = 60.0
    """Seconds each attempt of a request may wait for an answer. A server that stops answering
    fails a call after about `request_attempts` x this ([s3.md](s3.md#bounded-waits)).
    Default 60."""
    request_attempts: int = DEFAULT_REQUEST_ATTEMPTS
    """Attempts per request, the first included: throttling, 5xx answers, dropped connections
    and time-outs are retried by the client (boto3's standard retry mode). Default 4."""
    ca_bundle: str | None = None
    """A PEM file of the CAs that verify an `https://` `endpoint_url`
    ([security.md](security.md#s3)). Default: `AWS_CA_BUNDLE` or the system's CAs."""
    part_size_bytes: int = 8 * MiB
    """Bytes per uploaded part (S3: 5 MiB to 5 GiB). Memory per writer: about two parts (one on
    its way, one filling) plus the rows gathered for the next row group. Default 8 MiB."""
    max_file_bytes: int = 1024 * MiB
    """Bytes: a participant rolls over to a new object past this size (at most `part_size_bytes`
    x 10,000 and 5 TiB: S3's limits). Default 1 GiB."""
    row_group_rows: int = 1024 * 1024
    """Rows gathered into one Parquet row group, however small the batches written (Spark hands
    over 10,000-row batches): pyarrow's own default, so an epoch of fewer rows is one row group.
    Larger row groups encode faster and compress better. Default 1,048,576."""
    row_group_bytes: int = 64 * MiB
    """Arrow bytes gathered at most before they are encoded as a row group (also capped by
    `max_file_bytes`): the memory the gathered rows take. Default 64 MiB."""
    compression: str = "zstd"
    """Parquet codec: none, snappy, gzip, zstd, lz4 or brotli. Default zstd."""
    recovery_window_s: float = 7 * DAY_S
    """Seconds (at least a day) a stopped job may stay stopped and still finish its in-doubt
    epochs; a lifecycle rule that aborts incomplete uploads under the prefix sooner is refused
    at start. Default 604800 (7 days)."""

    def __post_init__(self) -> None:
        apply_conveniences(self)
        where = f"s3 sink {self.name!r}"
        check_sink_name(self.name, where)
        location = S3Location.parse(self.path, what=f"{where}: path")
        if not location.prefix:
            raise ConfigError(
                f"{where}: path {self.path!r} names a bucket without a prefix",
                fix=f"give the dataset its own folder: path='s3://{location.bucket}/events'",
            )
        self.connection  # noqa: B018 - validates the connection settings now
        if not MIN_PART_SIZE <= self.part_size_bytes <= MAX_PART_SIZE:
            raise ConfigError(
                f"{where}: part_size_bytes {self.part_size_bytes} is outside S3's limits for a "
                f"part ({MIN_PART_SIZE} to {MAX_PART_SIZE} bytes)",
                fix="leave the default (8 MiB) or give between 5 MiB and 5 GiB",
            )
        most = min(self.part_size_bytes * MAX_PARTS, MAX_OBJECT_SIZE)
        if not self.part_size_bytes <= self.max_file_bytes <= most:
            raise ConfigError(
                f"{where}: max_file_bytes {self.max_file_bytes} must be between "
                f"part_size_bytes ({self.part_size_bytes}) and {most} (S3 allows {MAX_PARTS} "
                "parts of part_size_bytes, and 5 TiB, per object)",
                fix="leave the default (1 GiB), or raise part_size_bytes for larger objects",
            )
        for option in ("row_group_rows", "row_group_bytes"):
            value = getattr(self, option)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"{where}: {option} must be a positive whole number, not {value!r}",
                    fix=f"leave the default or give a count of at least 1: {option}="
                    f"{getattr(type(self), option)}",
                )
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"{where}: compression {self.compression!r} is not one of {COMPRESSIONS}",
                fix="leave the default or choose one of those",
            )
        if not self.recovery_window_s >= DAY_S:
            raise ConfigError(
                f"{where}: recovery_window_s must be at least a day (86400)",
                fix="give how many seconds a stopped job may wait for its restart (default "
                "604800, 7 days)",
            )

    @property
    def location(self) -> S3Location:
        return S3Location.parse(self.path)

    @property
    def connection(self) -> S3Connection:
        return connection_of(self)

    def __repr__(self) -> str:
        return f"S3(path={self.path!r}, name={self.name!r})"
