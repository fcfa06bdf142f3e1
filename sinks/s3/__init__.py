"""S3 (or an S3-compatible server): Parquet objects written as multipart uploads (phase 1),
completed after the decision, and an epoch marker per committed epoch (docs/s3.md).

Importing this package loads only the configuration (no client): the sink and the readers
load boto3 when first used."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from durable_sinks.core.kinds import Deferred, SinkKind, deferred_members

from .config import S3, S3SinkConfig

if TYPE_CHECKING:
    from .epochs import EpochMarker, EpochObject
    from .reader import (
        committed_dataset,
        committed_markers,
        committed_objects,
        committed_schema,
    )
    from .sink import S3Sink


#: The kind `durable_sink("s3", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("s3", S3, Deferred(f"{__name__}.sink", "S3Sink"))

#: Each name this package loads on first use, and its module.
_LAZY = {
    "EpochMarker": ".epochs",
    "EpochObject": ".epochs",
    "committed_dataset": ".reader",
    "committed_markers": ".reader",
    "committed_objects": ".reader",
    "committed_schema": ".reader",
    "S3Sink": ".sink",
}
#: Former names, still importable (with a FutureWarning): the epoch's file is its marker.
_RENAMED = {"EpochManifest": "EpochMarker", "committed_manifests": "committed_markers"}


_deferred = deferred_members(__name__, _LAZY)


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        warnings.warn(
            f"durable_sinks.sinks.s3.{name} is now {_RENAMED[name]}", FutureWarning, stacklevel=2
        )
        name = _RENAMED[name]
    return _deferred(name)


__all__ = [
    "KIND",
    "S3",
    "EpochMarker",
    "EpochObject",
    "S3Sink",
    "S3SinkConfig",
    "committed_dataset",
    "committed_markers",
    "committed_objects",
    "committed_schema",
]
