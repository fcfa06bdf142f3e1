"""Decision stores: where the coordinator makes an epoch's commit decision durable (the
commit point), one module per store. A store never imports a sink.

Canonical import path: `from durable_sinks.manifest import LocalDirectoryStore,
DecisionRecord`; the Postgres store is `durable_sinks.manifest.postgres` (it loads psycopg).
"""

from ._choose import default_store_for, store_from
from ._file_store import LocalDirectoryStore
from ._hosted import HostedDecisionStore
from ._memory_store import MemoryDecisionStore, MemoryStoreBackend
from ._record import DecisionRecord
from ._store import DecisionStore, DroppableStore

__all__ = [
    "DecisionRecord",
    "DecisionStore",
    "DroppableStore",
    "HostedDecisionStore",
    "LocalDirectoryStore",
    "MemoryDecisionStore",
    "MemoryStoreBackend",
    "default_store_for",
    "store_from",
]
