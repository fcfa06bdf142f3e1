"""The Delta sink's configuration, `durable_sinks.Delta`: a frozen, picklable dataclass
checked when it is built (on the driver, before anything connects). Importing it loads no
client."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from durable_sinks.clients.s3 import (
    DEFAULT_REQUEST_ATTEMPTS,
    AddressingStyle,
    S3Connection,
    S3Location,
    connection_of,
)
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.naming import check_sink_name
from durable_sinks.core.secrets import check
from durable_sinks.core.settings import apply_conveniences

COMPRESSIONS = ("none", "snappy", "gzip", "zstd", "lz4", "brotli")
MODES = ("append", "upsert")
MiB = 1024 * 1024
_LOCAL = re.compile(r"^(file://)?/")

Mode = Literal["append", "upsert"]


@dataclass(frozen=True)
class Delta:
    """A Delta Lake table (delta-rs) as a sink: `durable_sink(Delta(path="/data/events"),
    job_id="orders", ...)`.

    Each epoch's rows are written as Parquet files the table does not reference yet; one
    Delta commit per epoch, carrying the job and epoch, makes them visible after the job's
    decision (docs/delta.md). Frozen and picklable; checked when built, on the driver, before
    anything connects.
    """

    kind: ClassVar[str] = "delta"

    path: str
    """The table's folder: an absolute local path or `s3://bucket/prefix`. Required."""
    name: str = "delta"
    """The sink's name within the job. Default "delta"."""
    mode: Mode = "append"
    """"append" (default): each epoch's rows are added. "upsert": by `key`, a row whose key
    is in the table replaces it, others are inserted."""
    key: tuple[str, ...] = ()
    """The upsert key columns (upsert mode only): a row whose key is in the table replaces
    it."""
    create_table: bool = False
    """Create a missing table from the first batch's schema. Default False: a missing table is
    refused at start."""
    partition_by: tuple[str, ...] = ()
    """Partition columns of a table the sink creates (strings, integers, booleans, dates); an
    existing table keeps its own, and a different list is refused."""
    endpoint_url: str | None = None
    """S3 tables: the server, `http(s)://host[:port]`. Default: AWS_ENDPOINT_URL_S3 /
    AWS_ENDPOINT_URL, else AWS."""
    region: str | None = None
    """S3 tables: the region. Default: the default chain."""
    access_key_id: str | None = field(default=None, repr=False)
    """S3 tables: access key id (with secret_access_key). Default: the default chain."""
    secret_access_key: str | None = field(default=None, repr=False)
    """S3 tables: secret access key (never shown). Default: the default chain."""
    session_token: str | None = field(default=None, repr=False)
    """S3 tables: session token (never shown). Default: the default chain."""
    addressing_style: AddressingStyle = "auto"
    """S3 tables: "auto", "path" or "virtual". Default "auto"."""
    connect_timeout_s: float = 10.0
    """S3 tables: seconds a connection attempt may take (whole seconds for delta-rs, rounded
    up). Default 10."""
    request_timeout_s: float = 60.0
    """S3 tables: seconds a request may take (rounded up). Default 60."""
    request_attempts: int = DEFAULT_REQUEST_ATTEMPTS
    """S3 tables: attempts per request of the sink's own S3 client (checks at start, the
    decision store beside the table), the first included. Default 4."""
    ca_bundle: str | None = None
    """Refused: delta-rs reads its CAs from the system or SSL_CERT_FILE only."""
    storage_options: Mapping[str, str] | None = field(default=None, repr=False)
    """Further delta-rs storage options (e.g. a DynamoDB lock,
    [delta.md](delta.md#object-stores-conditional-writes-checked-at-start)); values may be
    `${env:NAME}` references and are never shown."""
    compression: str = "zstd"
    """Parquet codec of the data files: none, snappy, gzip, zstd (default), lz4 or brotli."""
    max_file_bytes: int = 128 * MiB
    """A participant's data file larger than this rolls over to a new one, in bytes (at
    least 1 MiB). Default 128 MiB."""
    commit_retries: int = 15
    """Retries of a Delta commit that lost a race with another writer. Default 15."""

    def __post_init__(self) -> None:
        apply_conveniences(self)
        where = f"delta sink {self.name!r}"
        check_sink_name(self.name, where)
        if not isinstance(self.path, str) or not self.path:
            raise ConfigError(f"{where}: path must be a folder", fix="path='/data/events'")
        if self.path.startswith("s3://") or self.path.startswith("s3a://"):
            location = S3Location.parse(self.path.replace("s3a://", "s3://", 1), what=where)
            if not location.prefix:
                raise ConfigError(
                    f"{where}: path {self.path!r} names a bucket without a prefix",
                    fix=f"give the table its own folder: path='s3://{location.bucket}/events'",
                )
            self.connection  # noqa: B018 - validates the connection settings now
            if self.ca_bundle is not None:
                raise ConfigError(
                    f"{where}: ca_bundle is not supported by the Delta sink (delta-rs's HTTP "
                    "client reads its CAs from the system or SSL_CERT_FILE, for the whole "
                    "process)",
                    fix="leave ca_bundle unset and set SSL_CERT_FILE=<the PEM file> in the "
                    "environment of the driver and the executors",
                )
        elif not _LOCAL.match(self.path):
            raise ConfigError(
                f"{where}: path {self.path!r} is neither an absolute local path nor s3://",
                fix="give an absolute path ('/data/events') or 's3://bucket/events'",
            )
        if self.mode not in MODES:
            raise ConfigError(
                f"{where}: mode {self.mode!r} is not one of {MODES}",
                fix="mode='append', or mode='upsert' with key=[...]",
            )
        if self.mode == "upsert" and not self.key:
            raise ConfigError(
                f"{where}: mode 'upsert' needs the key columns",
                fix="give key='id' (or key=['a', 'b']): rows with the same key replace each other",
            )
        if self.mode == "append" and self.key:
            raise ConfigError(
                f"{where}: key is given but mode is 'append' (a key only matters to upsert)",
                fix="set mode='upsert' for upserts by key, or drop key",
            )
        for name, columns in (("key", self.key), ("partition_by", self.partition_by)):
            if not all(isinstance(c, str) and c for c in columns) or len(set(columns)) != len(
                columns
            ):
                raise ConfigError(
                    f"{where}: {name} {list(columns)!r} must be distinct column names",
                    fix=f"{name}=['a', 'b']",
                )
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"{where}: compression {self.compression!r} is not one of {COMPRESSIONS}",
                fix="leave the default (zstd) or choose one of those",
            )
        if self.max_file_bytes < MiB:
            raise ConfigError(
                f"{where}: max_file_bytes {self.max_file_bytes} is below 1 MiB",
                fix="leave the default (128 MiB)",
            )
        if not 0 <= self.commit_retries <= 1000:
            raise ConfigError(
                f"{where}: commit_retries must be between 0 and 1000",
                fix="leave the default (15)",
            )
        for option, value in (self.storage_options or {}).items():
            if not isinstance(option, str) or not isinstance(value, str):
                raise ConfigError(
                    f"{where}: storage_options must map option names to strings",
                    fix="storage_options={'AWS_S3_LOCKING_PROVIDER': 'dynamodb'}",
                )
            check(value, f"{where}: storage_options[{option!r}]")

    @property
    def on_s3(self) -> bool:
        return self.path.startswith(("s3://", "s3a://"))

    @property
    def location(self) -> S3Location:
        return S3Location.parse(self.path.replace("s3a://", "s3://", 1))

    @property
    def local_path(self) -> str:
        """The table's folder on this machine (local paths only)."""
        return self.path.removeprefix("file://").rstrip("/") or "/"

    @property
    def connection(self) -> S3Connection:
        return connection_of(self)

    def __repr__(self) -> str:
        return f"Delta(path={self.path!r}, name={self.name!r}, mode={self.mode!r})"
