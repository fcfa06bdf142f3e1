"""S3 (or an S3-compatible server): Parquet objects written as multipart uploads (phase 1),
completed after the decision, and an epoch manifest per committed epoch (docs/s3.md).

Importing this package loads only the configuration (no client): the sink and the readers
load boto3 when first used."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .config import S3, S3SinkConfig

if TYPE_CHECKING:
    from .epochs import EpochManifest, EpochObject
    from .reader import committed_dataset, committed_manifests, committed_objects
    from .sink import S3Sink

#: Each name this package loads on first use, and its module.
_LAZY = {
    "EpochManifest": ".epochs",
    "EpochObject": ".epochs",
    "committed_dataset": ".reader",
    "committed_manifests": ".reader",
    "committed_objects": ".reader",
    "S3Sink": ".sink",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "S3",
    "EpochManifest",
    "EpochObject",
    "S3Sink",
    "S3SinkConfig",
    "committed_dataset",
    "committed_manifests",
    "committed_objects",
]
