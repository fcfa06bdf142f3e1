"""S3 (or an S3-compatible server): Parquet objects written as multipart uploads (phase 1),
completed after the decision, and an epoch marker per committed epoch (docs/s3.md)."""

from durable_sinks.core.kinds import SinkKind

from .config import S3SinkConfig
from .epochs import EpochMarker, EpochObject
from .reader import committed_dataset, committed_markers, committed_objects
from .sink import S3Sink

#: The kind `durable_sink("s3", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("s3", S3SinkConfig, S3Sink)

__all__ = [
    "KIND",
    "EpochMarker",
    "EpochObject",
    "S3Sink",
    "S3SinkConfig",
    "committed_dataset",
    "committed_markers",
    "committed_objects",
]

#: Former names, still importable (with a FutureWarning): the epoch's file is its marker.
_RENAMED = {"EpochManifest": "EpochMarker", "committed_manifests": "committed_markers"}


def __getattr__(name: str) -> object:
    if name in _RENAMED:
        import warnings

        warnings.warn(
            f"durable_sinks.sinks.s3.{name} is now {_RENAMED[name]}",
            FutureWarning,
            stacklevel=2,
        )
        return globals()[_RENAMED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
