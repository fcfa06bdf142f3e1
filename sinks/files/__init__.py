"""Local Parquet files: the embedded sink (staging + fsync, create-only rename)."""

from .config import Files, FileSinkConfig
from .sink import MARKER, STAGING, FileSink

__all__ = ["MARKER", "STAGING", "FileSink", "FileSinkConfig", "Files"]
