"""Delta Lake tables (delta-rs): an epoch's Parquet files written under the table's folder
(phase 1) and one Delta log commit per epoch carrying the job's application transaction
(docs/delta.md).

Importing this package loads only the configuration (no client): `DeltaSink` loads
deltalake when first used."""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_sinks.core.kinds import Deferred, SinkKind, deferred_members

from .config import Delta

if TYPE_CHECKING:
    from .sink import DeltaSink

#: The kind `durable_sink("delta", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("delta", Delta, Deferred(f"{__name__}.sink", "DeltaSink"))

__getattr__ = deferred_members(__name__, {"DeltaSink": ".sink"})

__all__ = ["KIND", "Delta", "DeltaSink"]
