"""S3 (or an S3-compatible server): Parquet objects written as multipart uploads (phase 1),
completed after the decision, and an epoch manifest per committed epoch (docs/s3.md)."""

from .config import S3SinkConfig
from .epochs import EpochManifest, EpochObject
from .reader import committed_dataset, committed_manifests, committed_objects
from .sink import S3Sink

__all__ = [
    "EpochManifest",
    "EpochObject",
    "S3Sink",
    "S3SinkConfig",
    "committed_dataset",
    "committed_manifests",
    "committed_objects",
]
