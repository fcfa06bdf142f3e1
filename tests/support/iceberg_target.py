"""Iceberg catalogs and tables for tests, read back with pyiceberg scans:

- `IcebergCatalog`: pyiceberg's SQL catalog in a schema of its own in the test bed's Postgres,
  with a local warehouse folder;
- `RestIcebergCatalog`: the test bed's SeaweedFS Iceberg REST catalog, a namespace of its own
  in the table bucket, data files on S3.

Both answer the same calls (`CatalogUnderTest`)."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import psycopg

from durable_sinks.sinks.iceberg.journal import FOLDER as JOURNAL
from tests.services import IcebergRestEndpoint, PostgresEndpoint


class CatalogUnderTest(Protocol):
    """A catalog a test owns: `namespace` is its own (created by `create_namespace`)."""

    kind: str
    name: str
    namespace: str

    def properties(self, **overrides: str) -> dict[str, str]: ...
    def sink_options(self, table: str = "events", **options: Any) -> dict[str, Any]: ...
    def catalog(self) -> Any: ...
    def identifier(self, table: str = "events") -> tuple[str, str]: ...
    def create_namespace(self) -> None: ...
    def rows(self, table: str = "events") -> list[dict[str, Any]]: ...
    def data_locations(self, *, journal: bool = False) -> list[str]: ...
    def drop(self) -> None: ...


class _Common:
    name: str
    namespace: str

    def properties(self, **overrides: str) -> dict[str, str]:
        raise NotImplementedError

    def sink_options(self, table: str = "events", **options: Any) -> dict[str, Any]:
        return {
            "catalog": self.properties(),
            "catalog_name": self.name,
            "namespace": self.namespace,
            "table": table,
            **options,
        }

    def catalog(self) -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog(self.name, **self.properties())

    def identifier(self, table: str = "events") -> tuple[str, str]:
        return (self.namespace, table)

    def create_namespace(self) -> None:
        self.catalog().create_namespace(self.namespace)

    def rows(self, table: str = "events") -> list[dict[str, Any]]:
        scanned = self.catalog().load_table(self.identifier(table)).scan().to_arrow()
        return sorted(scanned.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


class IcebergCatalog(_Common):
    """A SQL catalog of its own (a fresh Postgres schema) and a warehouse under `folder`."""

    kind = "sql"
    namespace = "ds"

    def __init__(self, postgres: PostgresEndpoint, folder: Path) -> None:
        self.postgres = postgres
        self.schema = f"iceberg_{uuid.uuid4().hex[:12]}"
        self.name = f"cat_{uuid.uuid4().hex[:8]}"
        self.warehouse = folder / "warehouse"
        self.warehouse.mkdir(parents=True, exist_ok=True)
        with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{self.schema}"')

    def uri(self, *, port: int | None = None) -> str:
        p = self.postgres
        return (
            f"postgresql+psycopg://{quote(p.user, safe='')}:{quote(p.password, safe='')}"
            f"@{p.host}:{port or p.port}/{p.dbname}"
            f"?sslmode=disable&connect_timeout=5&options=-csearch_path%3D{self.schema}"
        )

    def properties(self, **overrides: str) -> dict[str, str]:
        return {
            "type": "sql",
            "uri": self.uri(),
            "warehouse": f"file://{self.warehouse}",
            **overrides,
        }

    def data_files(self, *, journal: bool = False) -> list[Path]:
        """Every data file in the warehouse; with `journal`, the sink's epoch journal entries
        instead."""
        return sorted(
            p for p in self.warehouse.rglob("*.parquet") if (JOURNAL in p.parts) is journal
        )

    def data_locations(self, *, journal: bool = False) -> list[str]:
        """Every data file in the warehouse (with `journal`: every epoch journal entry), as
        the table's metadata names them."""
        return [f"file://{p}" for p in self.data_files(journal=journal)]

    def drop(self) -> None:
        with psycopg.connect(self.postgres.conninfo(), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


class RestIcebergCatalog(_Common):
    """The test bed's Iceberg REST catalog, in a namespace of its own; the table bucket is
    shared by every test, so `drop` purges this namespace's tables and the namespace."""

    kind = "rest"

    def __init__(self, endpoint: IcebergRestEndpoint) -> None:
        self.endpoint = endpoint
        self.name = "rest"
        self.namespace = f"ds_{uuid.uuid4().hex[:12]}"
        self.bucket = endpoint.warehouse.removeprefix("s3://").strip("/")

    def properties(self, **overrides: str) -> dict[str, str]:
        return self.endpoint.catalog_properties(**overrides)

    def data_locations(self, *, journal: bool = False) -> list[str]:
        """Every data file under this namespace's tables (with `journal`: every epoch journal
        entry of the sink instead), listed with S3's own API."""
        client = self.endpoint.s3.client()
        found: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.namespace}/"
        ):
            found += [
                f"s3://{self.bucket}/{o['Key']}"
                for o in page.get("Contents", [])
                if o["Key"].endswith(".parquet") and (JOURNAL in o["Key"].split("/")) is journal
            ]
        return sorted(found)

    def drop(self) -> None:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        catalog = self.catalog()
        try:
            tables = catalog.list_tables(self.namespace)
        except NoSuchNamespaceError:
            return
        for identifier in tables:
            with contextlib.suppress(NoSuchTableError):
                catalog.purge_table(identifier)
        with contextlib.suppress(NoSuchNamespaceError):
            catalog.drop_namespace(self.namespace)


class IcebergTarget:
    """The conformance suite's target: a fresh table (the suite's schema) in `catalog`, read
    with a pyiceberg scan of its current snapshot.

    Leftovers are what no snapshot explains: a data file under the table's folder that the
    current snapshot does not reference (a prepared or half-written participant, or a losing
    attempt), and an epoch committed by more than one snapshot."""

    def __init__(self, catalog: CatalogUnderTest, name: str = "iceberg") -> None:
        from durable_sinks.testing import SCHEMA

        self.name = name
        self.catalog = catalog
        self.table = f"t_{uuid.uuid4().hex[:12]}"
        self._catalog = catalog.catalog()
        self.location = str(
            self._catalog.create_table(catalog.identifier(self.table), schema=SCHEMA).location()
        )

    def connector(self) -> Any:
        from durable_sinks.sinks import create

        return create("iceberg", {**self.catalog.sink_options(self.table), "name": self.name})

    def _loaded(self) -> Any:
        return self._catalog.load_table(self.catalog.identifier(self.table))

    def committed_rows(self) -> list[tuple[Any, ...]]:
        from durable_sinks.testing import COLUMNS

        scanned = self._loaded().scan().to_arrow()
        return [tuple(row[c] for c in COLUMNS) for row in scanned.to_pylist()]

    def committed_epochs(self) -> list[int]:
        return [
            int(s.summary["durable-sinks.epoch"])
            for s in self._loaded().snapshots()
            if s.summary is not None and "durable-sinks.epoch" in s.summary
        ]

    def leftovers(self) -> list[str]:
        table = self._loaded()
        referenced = {str(t.file.file_path) for t in table.scan().plan_files()}
        folder = self.location.rstrip("/") + "/data/"
        found = [p for p in self.catalog.data_locations() if p.startswith(folder)]
        problems = [f"data file {p} is in no snapshot" for p in found if p not in referenced]
        entries = self.catalog.data_locations(journal=True)
        problems += [f"epoch journal entry {p} is left" for p in entries if p.startswith(folder)]
        epochs = self.committed_epochs()
        problems += [
            f"epoch {e} committed twice" for e in sorted({e for e in epochs if epochs.count(e) > 1})
        ]
        return problems

    def cleanup(self) -> None:
        from pyiceberg.exceptions import NoSuchTableError

        with contextlib.suppress(NoSuchTableError):
            self._catalog.purge_table(self.catalog.identifier(self.table))
