"""The Delta sink's conformance target: a fresh Delta table (a local folder, or a prefix in
the test bed's S3), read as Delta's readers read it (delta-rs: the newest version's files).

Leftovers are what no committed version explains: a participant's journal, a data file in the
table's folder that no log version adds, and an epoch committed more than once (each commit
carrying the job's transaction must name a new epoch)."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from durable_sinks.core import SinkConnector
from durable_sinks.sinks.delta import Delta, DeltaSink
from durable_sinks.testing import COLUMNS, SCHEMA, Row
from tests.services import S3Endpoint
from tests.support.s3_objects import delete_prefix, object_keys
from tests.support.s3_target import s3_options


def delta_s3_options(endpoint: S3Endpoint, path: str, **options: Any) -> dict[str, Any]:
    """A Delta sink's options for a table in a test-bed S3 server (the S3 sink's, but a CA
    bundle: delta-rs takes its CAs from SSL_CERT_FILE)."""
    settings = s3_options(endpoint, path, **options)
    settings.pop("ca_bundle", None)
    return settings


def storage_options(endpoint: S3Endpoint) -> dict[str, str]:
    """delta-rs's options for reading a test-bed S3 table (what a reader would configure)."""
    return {
        "AWS_ENDPOINT_URL": endpoint.endpoint_url,
        "AWS_REGION": endpoint.region,
        "AWS_ACCESS_KEY_ID": endpoint.access_key_id,
        "AWS_SECRET_ACCESS_KEY": endpoint.secret_access_key,
        "AWS_ALLOW_HTTP": "true",
    }


class DeltaTarget:
    """A fresh table (created empty with the suite's schema, or left to the sink to create
    when `create=True`)."""

    def __init__(
        self,
        name: str = "delta",
        *,
        s3: S3Endpoint | None = None,
        create: bool = False,
        **options: Any,
    ) -> None:
        self.name = name
        self.s3 = s3
        self.options = options
        self._folder: Path | None = None
        if s3 is None:
            self._folder = Path(tempfile.mkdtemp(prefix="ds-delta-"))
            self.path = str(self._folder / "table")
            self.reader_options: dict[str, str] = {}
        else:
            self.prefix = f"deltaconf-{uuid.uuid4().hex[:12]}"
            self.path = f"s3://{s3.bucket}/{self.prefix}"
            self.reader_options = storage_options(s3)
        if not create:
            from deltalake import DeltaTable

            DeltaTable.create(self.path, schema=SCHEMA, storage_options=self.reader_options)
        self._rows: tuple[int, list[Row]] | None = None
        # The suite reads the target after every step: one reader, brought up to date with
        # the log's new versions only; log versions never change once written, so each is
        # read once; one S3 client.
        self._reader: Any = None
        self._log: dict[str, list[dict[str, Any]]] = {}
        self._client: Any = None

    def config(self) -> Delta:
        if self.s3 is not None:
            return Delta(**delta_s3_options(self.s3, self.path, name=self.name, **self.options))
        return Delta(path=self.path, name=self.name, **self.options)

    def connector(self) -> SinkConnector:
        return DeltaSink(self.config())

    def table(self) -> Any:
        from deltalake import DeltaTable

        return DeltaTable(self.path, storage_options=self.reader_options)

    def committed_rows(self) -> list[Row]:
        from deltalake import DeltaTable

        if self._reader is None:
            if not DeltaTable.is_deltatable(self.path, storage_options=self.reader_options):
                return []
            self._reader = self.table()
        else:
            self._reader.update_incremental()
        table = self._reader
        version = table.version()
        if self._rows is None or self._rows[0] != version:
            data = pa.table(table.to_pyarrow_table()).select(list(COLUMNS))
            self._rows = (version, [tuple(r[c] for c in COLUMNS) for r in data.to_pylist()])
        return list(self._rows[1])

    # -- what lies in the folder ---------------------------------------------------------------
    def files(self) -> list[str]:
        """Every file under the table's folder, relative to it."""
        if self.s3 is not None:
            keys = object_keys(self._s3_client(), self.s3.bucket, f"{self.prefix}/")
            return [k[len(self.prefix) + 1 :] for k in keys if not k.endswith("/")]
        return _local_files(Path(self.path))

    def _s3_client(self) -> Any:
        assert self.s3 is not None
        if self._client is None:
            self._client = self.s3.client()
        return self._client

    def _read(self, relative: str) -> str:
        if self.s3 is not None:
            key = f"{self.prefix}/{relative}"
            body = self._s3_client().get_object(Bucket=self.s3.bucket, Key=key)
            return str(body["Body"].read().decode())
        return (Path(self.path) / relative).read_text()

    def _entries(self, files: list[str]) -> list[dict[str, Any]]:
        """`_log_entries`, each version read once."""

        def read(relative: str) -> list[dict[str, Any]]:
            if relative not in self._log:
                self._log[relative] = _parse_log(self._read(relative))
            return self._log[relative]

        return _log_entries(files, read)

    def committed_epochs(self) -> list[int]:
        """The epochs of the job's commits, one entry per commit, in version order."""
        return _epochs(self._entries(self.files()))

    def leftovers(self) -> list[str]:
        files = self.files()
        return _leftovers(files, self._entries(files))

    def cleanup(self) -> None:
        if self.s3 is not None:
            delete_prefix(self._s3_client(), self.s3.bucket, f"{self.prefix}/")
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


# -- a table's folder, read from outside ---------------------------------------------------------
def _local_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _log_entries(
    files: list[str], read: Callable[[str], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Every action of every JSON log version, in version order."""
    entries = []
    for path in sorted(p for p in files if p.startswith("_delta_log/") and p.endswith(".json")):
        entries += read(path)
    return entries


def _parse_log(text: str) -> list[dict[str, Any]]:
    """The actions of one log version. Lines end with "\n" only: str.splitlines would also
    cut at U+2028, U+0085, ..., which a commit's JSON holds unescaped (e.g. in a MERGE's
    statistics)."""
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def _epochs(entries: list[dict[str, Any]]) -> list[int]:
    return [
        int(e["commitInfo"]["durable_sinks.epoch"])
        for e in entries
        if "commitInfo" in e and "durable_sinks.epoch" in e["commitInfo"]
    ]


def _leftovers(files: list[str], entries: list[dict[str, Any]]) -> list[str]:
    """Journals and staged rows, data files no version adds, epochs committed twice."""
    added = {e["add"]["path"] for e in entries if "add" in e}
    problems = []
    for path in files:
        if path.startswith(("_delta_log/", "_decisions/")):  # the log; the job's decisions
            continue
        if path.startswith("_durable_sinks/"):
            problems.append(f"{path} (a participant's journal or staged rows)")
        elif path not in added:
            problems.append(f"{path} (in no committed version)")
    epochs = _epochs(entries)
    twice = sorted({e for e in epochs if epochs.count(e) > 1})
    if twice:
        problems.append(f"epochs committed more than once: {twice}")
    return problems


def _local_entries(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    files = _local_files(path)
    return files, _log_entries(files, lambda r: _parse_log((path / r).read_text()))


def log_epochs(path: Path) -> list[int]:
    """The epochs of the durable-sinks commits of the local table at `path`."""
    return _epochs(_local_entries(path)[1])


def folder_leftovers(path: Path) -> list[str]:
    """What no committed version of the local table at `path` explains (see the module)."""
    return _leftovers(*_local_entries(path))
