"""The files sink's configuration, `durable_sinks.Files`: a frozen, picklable dataclass checked
when it is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.naming import check_sink_name
from durable_sinks.core.settings import apply_conveniences

COMPRESSIONS = ("none", "snappy", "gzip", "zstd", "lz4", "brotli")


@dataclass(frozen=True)
class Files:
    """A folder of Parquet files on a local POSIX file system as a sink:
    `durable_sink(Files(path="/data/events"), job_id="orders", ...)`.

    Each epoch is written under a staging folder and fsynced, then renamed into place
    (create-only) after the job's decision. Frozen and picklable; checked when built.
    """

    kind: ClassVar[str] = "files"

    path: str
    """The dataset's folder (created if missing), on a local POSIX file system; one job per
    path. Layout: `epoch=<batch id>/part=<part>/part-00000.parquet` plus `_EPOCH.json`;
    `_staging/` holds prepared batches and, for a moment at start, the write probe
    `.probe:<job>:<sink>:<generation>` (one left by a start killed while probing is removed by
    the next start). Required."""
    name: str = "files"
    """The sink's name within the job (no `/`). Default "files"."""
    compression: str = "zstd"
    """Parquet codec: none, snappy, gzip, zstd (default), lz4 or brotli."""
    fsync: bool = True
    """Make data durable before pre_commit returns. Default True; turn it off only for
    throwaway data: exactly-once then holds across process crashes, not machine crashes."""

    def __post_init__(self) -> None:
        apply_conveniences(self)
        if not str(self.path).strip():
            raise ConfigError("files sink: `path` is empty", fix="give the dataset's folder")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"files sink: compression {self.compression!r} is not one of {COMPRESSIONS}",
                sink=self.name,
                fix="leave the default or choose one of those",
            )
        check_sink_name(self.name, "files sink")
