"""S3 (or an S3-compatible server): Parquet objects written as multipart uploads (phase 1),
completed after the decision, and an epoch manifest per committed epoch (docs/s3.md)."""

from durable_sinks.core.kinds import SinkKind

from .config import S3SinkConfig
from .epochs import EpochManifest, EpochObject
from .reader import committed_dataset, committed_manifests, committed_objects
from .sink import S3Sink

#: The kind `durable_sink("s3", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("s3", S3SinkConfig, S3Sink)

__all__ = [
    "KIND",
    "EpochManifest",
    "EpochObject",
    "S3Sink",
    "S3SinkConfig",
    "committed_dataset",
    "committed_manifests",
    "committed_objects",
]
