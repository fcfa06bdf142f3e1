"""durable-sinks: exactly-once delivery from PySpark Structured Streaming into databases, Kafka,
object stores, table formats and local files (`durable_sinks.sinks.built_in()`), several sinks
at once, by two-phase commit.

    from durable_sinks import Postgres, durable_sink

    df.writeStream.foreachBatch(
        durable_sink(Postgres(dsn=..., table="events"), job_id="orders")
    ).option("checkpointLocation", "...").start()

This is the canonical import path of what a streaming job calls: `durable_sink`, `sink`, the
sinks' typed configurations (one per built-in kind: `Postgres`, `Kafka`, ...),
`register_data_source` (for `format("durable")`), `progress_listener` (each batch's numbers
beside Spark's query progress), `DeliveryGuarantee`, every error
durable-sinks raises (to catch them). The Spark entry points
and the configurations load on first use, so this import loads neither Spark nor any database
or Kafka client; nor does a configuration (its sink's client loads when the sink is built).
Sink authors find the protocol in `durable_sinks.core` and the conformance suite in
`durable_sinks.testing` (docs/architecture.md).
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .core.errors import (
    BadRowsError,
    BatchChangedError,
    CapabilityError,
    CommitIncompleteError,
    CommittedEpochLostError,
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
    StoredFormatError,
    TooManyBadRowsError,
    TransientError,
    UnreachableError,
    UsageError,
)
from .core.protocol import DeliveryGuarantee

if TYPE_CHECKING:
    from .sinks.delta.config import Delta
    from .sinks.folder.config import Files, Jsonl
    from .sinks.iceberg.config import Iceberg
    from .sinks.kafka.config import Kafka
    from .sinks.postgres.config import Postgres
    from .sinks.s3.config import S3
    from .spark import (
        BatchProgress,
        DurableBatchWriter,
        durable_sink,
        progress_listener,
        register_data_source,
        sink,
    )

try:
    __version__ = version("durable-sinks")
except PackageNotFoundError:  # pragma: no cover - imported from a tree that was not installed
    __version__ = "0+unknown"

#: Names that load the Spark entry points when first used.
_SPARK_NAMES = frozenset(
    {
        "durable_sink",
        "sink",
        "register_data_source",
        "DurableBatchWriter",
        "progress_listener",
        "BatchProgress",
    }
)


def typed_configurations() -> dict[str, type[Any]]:
    """The typed configuration of every built-in kind, by class name (`durable_sinks.sinks.
    built_in()`, the one list of kinds): the class of its package's `config` module whose
    `kind` is the kind's name. Each is importable from here; importing one loads configuration
    modules only, no client (nor checks that the client is installed)."""
    from . import sinks

    found: dict[str, type[Any]] = {}
    for kind in sinks.built_in():
        module = importlib.import_module(f"{sinks.package_of(kind)}.config")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and value.__module__ == module.__name__
                and getattr(value, "kind", None) == kind
            ):
                found[value.__name__] = value
    return found


def __getattr__(name: str) -> Any:
    if name in _SPARK_NAMES:
        value = getattr(importlib.import_module(".spark", __name__), name)
        globals()[name] = value
        return value
    typed = typed_configurations().get(name) if name[:1].isupper() else None
    if typed is not None:
        globals()[name] = typed
        return typed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "S3",
    "BadRowsError",
    "BatchChangedError",
    "BatchProgress",
    "CapabilityError",
    "CommitIncompleteError",
    "CommittedEpochLostError",
    "ConfigError",
    "CorruptRecordError",
    "DeliveryGuarantee",
    "Delta",
    "DurableBatchWriter",
    "DurableSinkError",
    "EpochOrderError",
    "FencedError",
    "Files",
    "Iceberg",
    "InDoubtError",
    "Jsonl",
    "Kafka",
    "ManifestCorruptError",
    "ManifestError",
    "OutageError",
    "ParticipantLostError",
    "Postgres",
    "ReplayMismatchError",
    "SchemaMismatchError",
    "StoredFormatError",
    "TooManyBadRowsError",
    "TransientError",
    "UnreachableError",
    "UsageError",
    "__version__",
    "durable_sink",
    "progress_listener",
    "register_data_source",
    "sink",
]
