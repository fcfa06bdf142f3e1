"""Local Parquet files: the embedded sink (staging + fsync, create-only rename)."""

from durable_sinks.core.kinds import SinkKind

from .config import Files
from .reader import committed_dataset, committed_schema
from .sink import MARKER, STAGING, FileSink

#: The kind `durable_sink("files", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("files", Files, FileSink)

__all__ = [
    "KIND",
    "MARKER",
    "STAGING",
    "FileSink",
    "Files",
    "committed_dataset",
    "committed_schema",
]
