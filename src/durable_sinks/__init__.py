"""durable-sinks: exactly-once delivery from PySpark Structured Streaming into Postgres, Kafka,
S3 and local files, several sinks at once, by two-phase commit.

    from durable_sinks import durable_sink, sink

    df.writeStream.foreachBatch(
        durable_sink("postgres", dsn=..., table="events", job_id="orders")
    ).option("checkpointLocation", "...").start()

This is the canonical import path of what a streaming job calls: `durable_sink`, `sink`,
`register_data_source` (for `format("durable")`), `DeliveryGuarantee`, and every error
durable-sinks raises (to catch them). The Spark entry points load on first use, so this import
loads neither Spark nor any database or Kafka client. Sink authors find the protocol in
`durable_sinks.core` and the conformance suite in `durable_sinks.testing` (docs/architecture.md).
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .core.errors import (
    BatchChangedError,
    CapabilityError,
    CommitIncompleteError,
    ConfigError,
    CorruptRecordError,
    DurableSinkError,
    EpochOrderError,
    FencedError,
    InDoubtError,
    ManifestCorruptError,
    ManifestError,
    OutageError,
    ParticipantLostError,
    ReplayMismatchError,
    SchemaMismatchError,
    TransientError,
    UnreachableError,
    UsageError,
)
from .core.protocol import DeliveryGuarantee

if TYPE_CHECKING:
    from .spark import DurableBatchWriter, durable_sink, register_data_source, sink

try:
    __version__ = version("durable-sinks")
except PackageNotFoundError:  # pragma: no cover - imported from a tree that was not installed
    __version__ = "0+unknown"

#: Names that load the Spark entry points when first used.
_SPARK_NAMES = frozenset({"durable_sink", "sink", "register_data_source", "DurableBatchWriter"})


def __getattr__(name: str) -> Any:
    if name in _SPARK_NAMES:
        value = getattr(importlib.import_module(".spark", __name__), name)
        globals()[name] = value
        return value
    if name == "RecoveryError":  # deprecated: never raised (core/errors.py)
        from .core import errors

        return errors.__getattr__(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BatchChangedError",
    "CapabilityError",
    "CommitIncompleteError",
    "ConfigError",
    "CorruptRecordError",
    "DeliveryGuarantee",
    "DurableBatchWriter",
    "DurableSinkError",
    "EpochOrderError",
    "FencedError",
    "InDoubtError",
    "ManifestCorruptError",
    "ManifestError",
    "OutageError",
    "ParticipantLostError",
    "ReplayMismatchError",
    "SchemaMismatchError",
    "TransientError",
    "UnreachableError",
    "UsageError",
    "__version__",
    "durable_sink",
    "register_data_source",
    "sink",
]
