"""Apache Iceberg tables (pyiceberg): an epoch's Parquet data files written under the table's
location (phase 1) and one Iceberg commit per epoch that appends them and records the epoch in
a table property (sink.py).

Importing this package loads only the configuration (no client): `IcebergSink` loads
pyiceberg when first used."""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_sinks.core.kinds import Deferred, SinkKind, deferred_members

from .config import Iceberg

if TYPE_CHECKING:
    from .sink import IcebergSink

#: The kind `durable_sink("iceberg", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("iceberg", Iceberg, Deferred(f"{__name__}.sink", "IcebergSink"))

__getattr__ = deferred_members(__name__, {"IcebergSink": ".sink"})

__all__ = ["KIND", "Iceberg", "IcebergSink"]
