"""Delta Lake tables (delta-rs): an epoch's Parquet files written under the table's folder
(phase 1) and one Delta log commit per epoch carrying the job's application transaction
(docs/delta.md)."""

from durable_sinks.core.kinds import SinkKind

from .config import DeltaSinkConfig
from .sink import DeltaSink

#: The kind `durable_sink("delta", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("delta", DeltaSinkConfig, DeltaSink)

__all__ = ["KIND", "DeltaSink", "DeltaSinkConfig"]
