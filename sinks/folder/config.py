"""The folder sinks' options: `Files` (Parquet) and `Jsonl` (JSON Lines), one frozen dataclass
per kind.

Every field is an option of `durable_sink("files", ...)` or `durable_sink("jsonl", ...)`: its
annotation is the type the registry checks before the class is even built (a misspelt name, a
missing `path`, a string given for `fsync` are refused there, with the closest name or the
wanted type), its docstring is the option's reference (`make docs` generates the docs' tables
from it), and `__post_init__` checks what a type cannot say. The classes must stay picklable
and hold no client: they travel to executors, and the sink touches the folder only in `open`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.naming import check_sink_name
from durable_sinks.core.settings import apply_conveniences

COMPRESSIONS = ("none", "snappy", "gzip", "zstd", "lz4", "brotli")


@dataclass(frozen=True)
class Files:
    """Parquet files in a local folder, exactly once: each part staged and fsynced, then
    published by a create-only rename after the job's decision.

    `durable_sink(Files(path="/data/events"), job_id="orders", ...)`; Spark, pyarrow and
    DuckDB read the folder as a Hive-partitioned Parquet dataset. Frozen and picklable;
    checked when built."""

    kind: ClassVar[str] = "files"

    path: str
    """Absolute path of the dataset's folder (created if missing), on a local POSIX file
    system; one sink of one job per folder. Layout:
    `epoch=<batch id>/part=<part>/part-00000.parquet` plus `_EPOCH.json`; `_staging/` holds
    prepared batches and, for a moment at start, the write probe
    `.probe:<job>:<sink>:<generation>` (one left by a start killed while probing is removed
    by the next start). Required."""
    name: str = "files"
    """The sink's name within the job (no `/`). Default "files"."""
    compression: str = "zstd"
    """Parquet codec: none, snappy, gzip, zstd (default), lz4 or brotli."""
    fsync: bool = True
    """Make every file durable before the call that creates it returns. Default True; turn it
    off only for throwaway data: exactly-once then holds across process crashes, not machine
    crashes."""

    def __post_init__(self) -> None:
        apply_conveniences(self)
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"files sink: compression {self.compression!r} is not one of {COMPRESSIONS}",
                sink=self.name,
                fix="leave the default or choose one of those",
            )
        check_folder(self.kind, self.path, self.name)


@dataclass(frozen=True)
class Jsonl:
    """JSON Lines files in a local folder, exactly once: each part staged and fsynced, then
    published by a create-only rename after the job's decision.

    One JSON object per row and line, in ASCII (other characters escaped); timestamps and
    dates in ISO 8601, decimals as strings, bytes in base64. Frozen and picklable; checked
    when built."""

    kind: ClassVar[str] = "jsonl"

    path: str
    """Absolute path of the folder the sink writes to (created if missing), on a local POSIX
    file system; one sink of one job per folder. Layout:
    `epoch=<batch id>/part=<part>/rows.jsonl` plus `_EPOCH.json`; `_staging/` holds prepared
    batches and, for a moment at start, the write probe `.probe:<job>:<sink>:<generation>`.
    Required."""
    name: str = "jsonl"
    """The sink's name within the job (no `/`). Default "jsonl"."""
    fsync: bool = True
    """Make every file durable before the call that creates it returns. Default True; turn it
    off only for throwaway data: exactly-once then holds across process crashes, not machine
    crashes."""

    def __post_init__(self) -> None:
        apply_conveniences(self)
        check_folder(self.kind, self.path, self.name)


#: The configuration of either kind.
FolderConfig = Files | Jsonl


def check_folder(kind: str, path: str, name: str) -> None:
    """The checks both kinds share: a path that is not empty and absolute, a valid name."""
    if not path.strip():
        raise ConfigError(f"{kind} sink: `path` is empty", fix="give the folder's path")
    check_sink_name(name, f"{kind} sink")
    if not os.path.isabs(path):
        # A relative path is resolved against the current directory: a driver restarted from
        # another one, or an executor, would find neither the staged epochs nor the published.
        raise ConfigError(
            f"{kind} sink: path {path!r} is relative",
            sink=name,
            fix=f"give an absolute path, e.g. {os.path.abspath(path)!r}",
        )
