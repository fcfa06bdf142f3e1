"""Delta Lake tables (delta-rs): an epoch's Parquet files written under the table's folder
(phase 1) and one Delta log commit per epoch carrying the job's application transaction
(docs/delta.md)."""

from .config import DeltaSinkConfig
from .sink import DeltaSink

__all__ = ["DeltaSink", "DeltaSinkConfig"]
