"""How one part's rows become files: the one thing the two folder kinds do differently.

An encoder names a participant's data files, opens one for writing, says which files of a
published part folder are data, and counts their rows (for `durable-sinks verify`). Everything
else (the layout, staging, the create-only rename, markers, recovery, the operator views) is
shared and knows no format.

- `ParquetEncoder` (`files`): `part-00000.parquet`, compressed with the configured codec. A
  Parquet file holds one schema, so a batch of another (evolved) schema starts the next file,
  `part-00001.parquet`, ... The digest covers each batch's Arrow IPC form; `bytes` is the
  batches' Arrow size. Rows are counted from the files' footers.
- `JsonLinesEncoder` (`jsonl`): `rows.jsonl`, one JSON object per row and line, in ASCII. Each
  row carries its own columns, so batches of any schema go into the one file. The digest and
  `bytes` cover the encoded lines. Rows are counted line by line.
"""

from __future__ import annotations

import datetime
import decimal
import json
from abc import ABC, abstractmethod
from base64 import b64encode
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar

from .config import FolderConfig, Jsonl

if TYPE_CHECKING:
    from hashlib import _Hash

    import pyarrow as pa


class UnencodableError(ValueError):
    """A row the format has no form for (errors.py makes it a SchemaMismatchError)."""


class EncodedFile(ABC):
    """One data file being written: batches in, then closed (flushed, not yet fsynced)."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema

    @abstractmethod
    def write(self, batch: pa.RecordBatch, digest: _Hash) -> int:
        """Write `batch`, feed what it wrote to `digest`; the bytes it counts for."""

    @abstractmethod
    def close(self) -> None:
        """Flush and close (idempotent); the file is complete on disk, not yet fsynced."""


class Encoder(ABC):
    """One file format of a folder sink."""

    #: Whether a file holds one schema: a batch of another one then starts the next file
    #: (and the handle records each file's schema). False: every row carries its own columns.
    one_schema_per_file: ClassVar[bool]

    @abstractmethod
    def file_name(self, number: int) -> str:
        """The name of a participant's data file number `number` (0 for its first)."""

    @abstractmethod
    def open(self, path: Path, schema: pa.Schema) -> EncodedFile:
        """A new data file at `path` (created only if absent), for batches of `schema`."""

    @abstractmethod
    def data_files(self, folder: Path) -> list[Path]:
        """The data files of a staging or published part folder, in file order."""

    @abstractmethod
    def count_rows(self, path: Path) -> int:
        """The rows in one data file, read from the file itself."""


def encoder_for(config: FolderConfig) -> Encoder:
    """The encoder of a configuration's kind."""
    if isinstance(config, Jsonl):
        return JsonLinesEncoder()
    return ParquetEncoder(config.compression)


# -- Parquet ---------------------------------------------------------------------------------
class ParquetEncoder(Encoder):
    one_schema_per_file = True

    def __init__(self, compression: str) -> None:
        self.compression = compression

    def file_name(self, number: int) -> str:
        return f"part-{number:05d}.parquet"

    def open(self, path: Path, schema: pa.Schema) -> EncodedFile:
        return _ParquetFile(path, schema, self.compression)

    def data_files(self, folder: Path) -> list[Path]:
        return sorted(folder.glob("*.parquet"))

    def count_rows(self, path: Path) -> int:
        import pyarrow.parquet as pq

        return int(pq.read_metadata(path).num_rows)


class _ParquetFile(EncodedFile):
    def __init__(self, path: Path, schema: pa.Schema, compression: str) -> None:
        import pyarrow.parquet as pq

        super().__init__(path, schema)
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(
            path, schema, compression=compression
        )

    def write(self, batch: pa.RecordBatch, digest: _Hash) -> int:
        if self._writer is None:
            raise ValueError(f"{self.path} is closed")
        self._writer.write_batch(batch)
        digest.update(batch.serialize())
        return int(batch.nbytes)

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()


# -- JSON Lines ------------------------------------------------------------------------------
ROWS = "rows.jsonl"


class JsonLinesEncoder(Encoder):
    one_schema_per_file = False

    def file_name(self, number: int) -> str:
        return ROWS  # one file per participant: every row carries its own columns

    def open(self, path: Path, schema: pa.Schema) -> EncodedFile:
        return _JsonLinesFile(path, schema)

    def data_files(self, folder: Path) -> list[Path]:
        return sorted(folder.glob("*.jsonl"))

    def count_rows(self, path: Path) -> int:
        with path.open("rb") as file:
            return sum(1 for _ in file)


class _JsonLinesFile(EncodedFile):
    def __init__(self, path: Path, schema: pa.Schema) -> None:
        super().__init__(path, schema)
        self._file: IO[bytes] | None = open(path, "xb")  # noqa: SIM115

    def write(self, batch: pa.RecordBatch, digest: _Hash) -> int:
        if self._file is None:
            raise ValueError(f"{self.path} is closed")
        data = encode_rows(batch)
        self._file.write(data)
        digest.update(data)
        return len(data)

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()


def encode_rows(batch: pa.RecordBatch) -> bytes:
    """One JSON object per row and line, keys in column order, in ASCII: every other
    character is escaped (`\\u2028`), so that no reader splitting lines on more than `\\n`
    (Python's `str.splitlines` splits on U+0085 and U+2028 too) cuts a row in two. Values
    JSON lacks are written as text: timestamps and dates in ISO 8601, decimals as their
    digits, bytes in base64; non-finite floats as `NaN`/`Infinity` (as Python's json reads
    them). A value of any other type is an UnencodableError, raised before anything of the
    batch is written."""
    try:
        lines = [
            json.dumps(row, separators=(",", ":"), default=_as_json) for row in batch.to_pylist()
        ]
    except (TypeError, ValueError) as exc:
        raise UnencodableError(f"a row cannot be written as JSON: {exc}") from exc
    return "".join(f"{line}\n" for line in lines).encode()


def _as_json(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} {value!r} has no JSON form")
