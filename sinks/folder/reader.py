"""Reading a `files` sink's committed epochs: its published part folders (each moved into
place with its marker in one rename, so a part folder with a marker is whole; `_staging` is
never read), as one `pyarrow.dataset` with `epoch` and `part` columns from the folders::

    from durable_sinks.sinks.folder import committed_dataset
    table = committed_dataset("/data/events").to_table()

Under schema evolution the files hold different schemas: the dataset's schema is theirs
unified (`committed_schema`, core/evolution.py): a column a file lacks reads as null, a
widened column is read in its widest type.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from durable_sinks.core.evolution import schema_of_text, unify

from .handles import FolderHandleDetails
from .layout import Layout, read_marker

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as ds


def part_schemas(part: Path) -> list[pa.Schema]:
    """The schemas of a part's Parquet files: from its marker, or their footers if the
    marker records none."""
    import pyarrow.parquet as pq

    marker = read_marker(part)
    recorded = FolderHandleDetails.of(marker).schemas if marker is not None else ()
    if recorded:
        return [schema_of_text(text) for text in recorded]
    return [pq.read_schema(f) for f in sorted(part.glob("*.parquet"))]


def committed_schema(path: str | Path, *, epochs: range | None = None) -> pa.Schema | None:
    """The schema of the committed epochs under `path` (in `epochs` if given): every file's
    schema unified, without the `epoch` and `part` columns; None when no epoch holds a file.
    Spark readers give it as the read schema (`mergeSchema` does not merge int32 with int64
    files): `spark.read.schema(from_arrow_schema(committed_schema(path))).parquet(path)`."""
    parts = Layout(Path(path)).committed_parts(epochs)
    return unify(s for part in parts for s in part_schemas(part))


def committed_dataset(path: str | Path, *, epochs: range | None = None) -> ds.Dataset:
    """A `pyarrow.dataset` of the committed epochs' files under `path` (in `epochs` if
    given), in their unified schema, with `epoch` and `part` columns."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    root = Path(path)
    parts = Layout(root).committed_parts(epochs)
    files = [str(f) for part in parts for f in sorted(part.glob("*.parquet"))]
    partitions = pa.schema([("epoch", pa.int32()), ("part", pa.string())])
    schema = unify(s for part in parts for s in part_schemas(part))
    if schema is not None:
        for field in partitions:
            if field.name not in schema.names:
                schema = schema.append(field)
    return ds.dataset(
        files,
        schema=schema,
        format="parquet",
        partitioning=ds.partitioning(partitions, flavor="hive"),
        partition_base_dir=str(root),
    )
