"""The Iceberg sink's task brief (core/protocol.py `TaskBriefing`): what the driver hands each
executor-mode task with the epoch, so that the task writes and prepares its part without a
catalog or a metadata file of its own.

The brief is JSON (bytes) holding non-secret facts of the table, as the driver last read it:

- `metadata`: the table's metadata trimmed to what a writer reads: the current schema, the
  default partition spec and sort order, the location, the format version and the table's
  properties; of its snapshots only the current one (its id: the table the task wrote for);
  no history, no logs, no other schemas or specs;
- `metadata_location`, `identifier`: names, for messages;
- `io`: the FileIO properties the driver's table was opened with (endpoint, region, path
  style, the FileIO implementation ...), **without any secret**: a property whose name looks
  secret (`s3.secret-access-key`, `s3.access-key-id`, `token`, `credential`, ...:
  core/redaction.py `is_secret`) or whose value holds a password in a URL is left out, and so
  is a table property whose name looks secret. The task takes those from its own copy of the
  sink's catalog properties (the configuration the user gave the sink, `${env:...}`
  references resolved where the task runs), as it does when it opens the catalog itself.

So the brief never carries a credential. When the driver's FileIO holds a secret that the
sink's configuration does not (credentials the catalog vended with the table), a task could
not rebuild it: then there is no brief (`of` gives None), and every task opens the catalog
itself, as without one.

A task's data files are written for the table as briefed; the driver's epoch commit checks
them as it checks files written after a task's own read of the table (which is no later than
the brief: before the task's rows): the commit asserts that the main branch has not moved
since the driver's read (any other writer's commit in between makes it lose the race,
retried after a fresh read), and each file's partition spec id must be the spec of the table
as the commit reads it (handles.data_files_of: files of another spec refuse the epoch). A
column added by another writer between the brief and the commit needs no check: Iceberg
reads the files by field id (the new column reads as null in them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from durable_sinks.core.redaction import is_secret

from .config import Iceberg
from .layout import PREFIX

if TYPE_CHECKING:
    from pyiceberg.table import Table

#: The version of the brief's JSON; a task given any other finds what it needs itself.
VERSION = 1
#: A password inside a URL (`scheme://user:password@host`).
_URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/:@\s]*:[^@/\s]*@")


def _secret(key: str, value: str) -> bool:
    return is_secret(key) or bool(_URL_PASSWORD.search(value))


def of(table: Table, epoch: int, config: Iceberg) -> bytes | None:
    """The brief of `epoch` for tasks writing into `table` (as the driver read it); None when
    the table's FileIO holds a secret the sink's configuration does not give (credentials
    vended by the catalog, or a secret-looking table property: pyiceberg's catalogs hand the
    table's properties to its FileIO too)."""
    own = {k: str(v) for k, v in config.catalog_properties().items()}
    io_properties = {str(k): str(v) for k, v in table.io.properties.items()}
    if any(_secret(k, v) and own.get(k) != v for k, v in io_properties.items()):
        return None
    metadata = table.metadata
    current = metadata.current_snapshot()
    properties = {
        k: v
        for k, v in metadata.properties.items()
        if k.startswith(f"{PREFIX}.") or not _secret(k, v)
    }
    refs = {name: ref for name, ref in metadata.refs.items() if name == "main"}
    trimmed = metadata.model_copy(
        update={
            "schemas": [metadata.schema()],
            "partition_specs": [metadata.spec()],
            "sort_orders": [metadata.sort_order()],
            "snapshots": [current] if current is not None else [],
            "snapshot_log": [],
            "metadata_log": [],
            "refs": refs if current is not None else {},
            "properties": properties,
            "statistics": [],
            "partition_statistics": [],
        }
    )
    content = {
        "v": VERSION,
        "epoch": epoch,
        "identifier": list(table.name()),
        "metadata_location": table.metadata_location,
        "metadata": json.loads(trimmed.model_dump_json()),
        "io": {k: v for k, v in io_properties.items() if not _secret(k, v)},
    }
    return json.dumps(content, sort_keys=True).encode()


def table_of(brief: bytes, config: Iceberg) -> tuple[int, Table] | None:
    """The epoch `brief` is for and the table a task writes into, built from the brief and
    the sink's own configuration (its secrets) without a catalog; None when the brief is
    not one of this version (the task then opens the catalog)."""
    from pyiceberg.catalog.noop import NoopCatalog
    from pyiceberg.io import load_file_io
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadataUtil

    try:
        content = json.loads(brief)
        if not isinstance(content, Mapping) or content.get("v") != VERSION:
            return None
        epoch = content["epoch"]
        own = {k: str(v) for k, v in config.catalog_properties().items()}
        properties: dict[str, Any] = {**own, **dict(content["io"])}
        location = str(content["metadata_location"])
        identifier = tuple(str(part) for part in content["identifier"])
        metadata = TableMetadataUtil.parse_obj(dict(content["metadata"]))
        if not isinstance(epoch, int):
            return None
    except (KeyError, TypeError, ValueError):  # pydantic's ValidationError is a ValueError
        return None
    table = Table(
        identifier=identifier,
        metadata=metadata,
        metadata_location=location,
        io=load_file_io(properties, location),
        catalog=NoopCatalog("task-brief"),
    )
    return epoch, table
