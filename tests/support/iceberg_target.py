"""An Iceberg table for tests: pyiceberg's SQL catalog in a schema of its own in the test bed's
Postgres, with a local warehouse folder; readers read with pyiceberg scans."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from tests.services import PostgresEndpoint


class IcebergCatalog:
    """A SQL catalog of its own (a fresh Postgres schema) and a warehouse under `folder`."""

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

    def sink_options(self, table: str = "events", **options: Any) -> dict[str, Any]:
        return {
            "catalog": self.properties(),
            "catalog_name": self.name,
            "namespace": "ds",
            "table": table,
            **options,
        }

    def catalog(self) -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog(self.name, **self.properties())

    def create_namespace(self, namespace: str = "ds") -> None:
        self.catalog().create_namespace(namespace)

    def rows(self, table: str = "events", namespace: str = "ds") -> list[dict[str, Any]]:
        scanned = self.catalog().load_table((namespace, table)).scan().to_arrow()
        return sorted(scanned.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))

    def data_files(self) -> list[Path]:
        return sorted(self.warehouse.rglob("*.parquet"))

    def drop(self) -> None:
        with psycopg.connect(self.postgres.conninfo(), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
