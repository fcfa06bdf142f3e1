"""The S3 sink's configuration: a picklable dataclass checked when it is built (on the driver,
before anything connects)."""

from __future__ import annotations

from dataclasses import dataclass, field

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.naming import check_sink_name
from durable_sinks.core.s3 import (
    MAX_OBJECT_SIZE,
    MAX_PART_SIZE,
    MAX_PARTS,
    MIN_PART_SIZE,
    AddressingStyle,
    S3Connection,
    S3Location,
    connection_of,
)

COMPRESSIONS = ("none", "snappy", "gzip", "zstd", "lz4", "brotli")
MiB = 1024 * 1024


@dataclass(frozen=True)
class S3SinkConfig:
    """Configuration of an S3Sink (picklable; validated when built).

    - path: `s3://bucket/prefix`, the dataset's folder (the bucket must exist; one job per
      prefix).
    - name: the sink's name within the job.
    - endpoint_url, region, access_key_id, secret_access_key, session_token,
      addressing_style, connect_timeout, read_timeout, ca_bundle (a PEM file of CAs for an
      https endpoint): how to reach the server (unset: boto3's
      default chain and AWS; see `durable_sinks.core.s3.S3Connection`). Secrets are never
      shown.
    - part_size: bytes per multipart-upload part (5 MiB to 5 GiB; default 8 MiB). The sink
      holds about one part (plus the row group being encoded) in memory per object.
    - max_object_bytes: an epoch's part larger than this rolls over to a new object (default
      1 GiB; at most part_size x 10,000 parts, S3's limit).
    - compression: Parquet codec.
    - recovery_window_days: how long a stopped job may stay stopped and still finish its
      in-doubt epochs. A bucket lifecycle rule that aborts incomplete multipart uploads sooner
      could destroy a decided epoch's data: the sink refuses to start then (default 7).
    """

    path: str
    name: str = "s3"
    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    addressing_style: AddressingStyle = "auto"
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    ca_bundle: str | None = None
    part_size: int = 8 * MiB
    max_object_bytes: int = 1024 * MiB
    compression: str = "zstd"
    recovery_window_days: int = 7

    def __post_init__(self) -> None:
        where = f"s3 sink {self.name!r}"
        check_sink_name(self.name, where)
        location = S3Location.parse(self.path, what=f"{where}: path")
        if not location.prefix:
            raise ConfigError(
                f"{where}: path {self.path!r} names a bucket without a prefix",
                fix=f"give the dataset its own folder: path='s3://{location.bucket}/events'",
            )
        self.connection  # noqa: B018 - validates the connection settings now
        if not MIN_PART_SIZE <= self.part_size <= MAX_PART_SIZE:
            raise ConfigError(
                f"{where}: part_size {self.part_size} is outside S3's limits for a part "
                f"({MIN_PART_SIZE} to {MAX_PART_SIZE} bytes)",
                fix="leave the default (8 MiB) or give between 5 MiB and 5 GiB",
            )
        most = min(self.part_size * MAX_PARTS, MAX_OBJECT_SIZE)
        if not self.part_size <= self.max_object_bytes <= most:
            raise ConfigError(
                f"{where}: max_object_bytes {self.max_object_bytes} must be between part_size "
                f"({self.part_size}) and {most} (S3 allows {MAX_PARTS} parts of part_size, "
                "and 5 TiB, per object)",
                fix="leave the default (1 GiB), or raise part_size for larger objects",
            )
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"{where}: compression {self.compression!r} is not one of {COMPRESSIONS}",
                fix="leave the default or choose one of those",
            )
        if self.recovery_window_days < 1:
            raise ConfigError(
                f"{where}: recovery_window_days must be >= 1",
                fix="give how many days a stopped job may wait for its restart (default 7)",
            )

    @property
    def location(self) -> S3Location:
        return S3Location.parse(self.path)

    @property
    def connection(self) -> S3Connection:
        return connection_of(self)

    def __repr__(self) -> str:
        return f"S3SinkConfig(path={self.path!r}, name={self.name!r})"
