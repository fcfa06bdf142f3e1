"""The files sink's configuration: a picklable dataclass checked when it is built."""

from __future__ import annotations

from dataclasses import dataclass

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.naming import check_sink_name

COMPRESSIONS = ("none", "snappy", "gzip", "zstd", "lz4", "brotli")


@dataclass(frozen=True)
class FileSinkConfig:
    """Configuration of a FileSink (picklable; validated when built).

    - path: folder of the dataset (created if missing), on a local POSIX file system.
    - name: the sink's name within the job.
    - compression: Parquet codec.
    - fsync: make data durable before pre_commit returns (turn off only for throwaway data:
      exactly-once then holds across process crashes, not machine crashes).
    """

    path: str
    name: str = "files"
    compression: str = "zstd"
    fsync: bool = True

    def __post_init__(self) -> None:
        if not str(self.path).strip():
            raise ConfigError("files sink: `path` is empty", fix="give the dataset's folder")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"files sink: compression {self.compression!r} is not one of {COMPRESSIONS}",
                sink=self.name,
                fix="leave the default or choose one of those",
            )
        check_sink_name(self.name, "files sink")
