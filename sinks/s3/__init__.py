"""S3 (or an S3-compatible server): Parquet objects written as multipart uploads (phase 1),
completed after the decision, and an epoch marker per committed epoch (docs/s3.md).

Importing this package loads only the configuration (no client): the sink and the readers
load boto3 when first used."""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_sinks.core.kinds import Deferred, SinkKind, deferred_members

from .config import S3

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
__getattr__ = deferred_members(__name__, _LAZY)


__all__ = [
    "KIND",
    "S3",
    "EpochMarker",
    "EpochObject",
    "S3Sink",
    "committed_dataset",
    "committed_markers",
    "committed_objects",
    "committed_schema",
]
