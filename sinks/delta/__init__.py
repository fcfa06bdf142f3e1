"""Delta Lake tables (delta-rs): an epoch's Parquet files written under the table's folder
(phase 1) and one Delta log commit per epoch carrying the job's application transaction
(docs/delta.md).

Importing this package loads only the configuration (no client): `DeltaSink` loads
deltalake when first used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durable_sinks.core.kinds import SinkKind
from durable_sinks.core.protocol import SinkConnector

from .config import Delta, DeltaSinkConfig

if TYPE_CHECKING:
    from .sink import DeltaSink


def _build(config: Delta) -> SinkConnector:
    from .sink import DeltaSink

    return DeltaSink(config)


#: The kind `durable_sink("delta", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("delta", Delta, _build)


def __getattr__(name: str) -> Any:
    if name == "DeltaSink":
        from .sink import DeltaSink

        return DeltaSink
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["KIND", "Delta", "DeltaSink", "DeltaSinkConfig"]
