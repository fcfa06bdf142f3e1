"""Spark's own Iceberg reader, independent of pyiceberg: reads an Iceberg table through Spark's
Iceberg catalog (`org.apache.iceberg.spark.SparkCatalog`, Java's Iceberg library) in a child
process running the pyspark 4.1 interpreter of tests/services/iceberg_spark.py.

    read = read_with_spark(testbed, "cat_x", catalog.properties(), ("ds", "events"), tmp_path)
    read.rows, read.data_files, read.snapshots

The child is given the table's catalog as Spark catalog settings translated from the pyiceberg
catalog properties the sink was given (`spark_catalog_settings`), under the same catalog name:

- SQL catalog on Postgres (`type=sql`, `uri=postgresql+psycopg://user:pw@host:port/db?...`) ->
  Iceberg's JdbcCatalog (`type=jdbc`, `uri=jdbc:postgresql://host:port/db`, `jdbc.user`,
  `jdbc.password`; a `search_path` in the URL's `options` becomes `currentSchema`). pyiceberg's
  SqlCatalog and JdbcCatalog keep tables in the same `iceberg_tables` rows, keyed by catalog
  name, so the names must match.
- REST catalog (`type=rest`, `uri`, `credential`, `warehouse`, ...) -> the same properties.
- Either, with `s3.*` properties: S3FileIO (iceberg-aws-bundle) with them, path-style access
  (what SeaweedFS and moto serve), `s3.region` as `client.region`.

Run as `python -m tests.support.iceberg_spark_reader PLAN.json` in that interpreter, the child
builds its session from the plan's settings alone (the test bed's `local[2]` defaults, the
Iceberg jars, the catalog) and writes the table's rows (an Arrow IPC file), its current
snapshot's data files and every snapshot's summary beside the plan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

if TYPE_CHECKING:
    import pyarrow as pa

    from tests.services import Testbed

#: How long one read may take: a Spark driver's start on a busy 2-core machine and the read.
READ_TIMEOUT = 300.0
#: pyiceberg-only properties (Java's Iceberg has its own names or none).
_PYICEBERG_ONLY = {"type", "uri", "py-io-impl", "s3.region", "s3.force-virtual-addressing"}


def spark_catalog_settings(name: str, properties: Mapping[str, str]) -> dict[str, str]:
    """The Spark settings (`spark.sql.catalog.<name>...`) of a Spark Iceberg catalog that sees
    what the pyiceberg catalog `properties` (named `name`) see. Raises ValueError for a catalog
    type or SQL backend Java's Iceberg cannot share with pyiceberg here."""
    kind = properties.get("type", "rest")
    java: dict[str, str] = {}
    if kind == "sql":
        java.update(_jdbc(properties["uri"]))
        java["type"] = "jdbc"
    elif kind == "rest":
        java["type"] = "rest"
        java["uri"] = properties["uri"]
    else:
        raise ValueError(f"no Spark catalog for a pyiceberg catalog of type {kind!r}")
    for key, value in properties.items():
        if key not in _PYICEBERG_ONLY:
            java[key] = value
    if any(key.startswith("s3.") for key in properties) or str(
        properties.get("warehouse", "")
    ).startswith(("s3://", "s3a://")):
        java["io-impl"] = "org.apache.iceberg.aws.s3.S3FileIO"
        java.setdefault("s3.path-style-access", "true")
        java["client.region"] = properties.get("s3.region", "us-east-1")
    prefix = f"spark.sql.catalog.{name}"
    return {prefix: "org.apache.iceberg.spark.SparkCatalog"} | {
        f"{prefix}.{key}": value for key, value in java.items()
    }


def _jdbc(uri: str) -> dict[str, str]:
    """A SQLAlchemy Postgres URL as JdbcCatalog's `uri`, `jdbc.user`, `jdbc.password`."""
    parts = urlsplit(uri)
    if parts.scheme.split("+")[0] not in ("postgresql", "postgres"):
        raise ValueError(f"a SQL catalog on {parts.scheme!r}: only Postgres is shared with Spark")
    query = parse_qs(parts.query)
    jdbc_query = []
    for option in query.get("options", []):
        for setting in option.split():
            key, _, value = setting.removeprefix("-c").partition("=")
            if key == "search_path":
                jdbc_query.append(f"currentSchema={value}")
    jdbc_query += [f"sslmode={mode}" for mode in query.get("sslmode", [])]
    settings = {
        "uri": f"jdbc:postgresql://{parts.hostname}:{parts.port or 5432}{parts.path}"
        + (f"?{'&'.join(jdbc_query)}" if jdbc_query else "")
    }
    if parts.username:
        settings["jdbc.user"] = unquote(parts.username)
    if parts.password:
        settings["jdbc.password"] = unquote(parts.password)
    return settings


@dataclass(frozen=True)
class SparkRead:
    """What Spark's Iceberg reader saw of one table at its current snapshot."""

    rows: pa.Table
    #: The data files the current snapshot references (the `files` metadata table).
    data_files: list[str]
    #: Every snapshot's summary, oldest first (the `snapshots` metadata table).
    snapshots: list[dict[str, str]]
    #: With a `where` filter: Spark's physical plan of the filtered read (`rows` then holds
    #: the rows it returned).
    plan: str = ""

    def column(self, name: str) -> list[Any]:
        return list(self.rows.column(name).to_pylist())


def read_with_spark(
    testbed: Testbed,
    catalog_name: str,
    properties: Mapping[str, str],
    identifier: Sequence[str],
    folder: Path,
    where: str | None = None,
) -> SparkRead:
    """Read table `identifier` of the pyiceberg catalog (`catalog_name`, `properties`) with
    Spark's Iceberg reader in a child process; its log stays in `folder` when it fails. With
    `where` (a Spark SQL condition), the rows read are those it keeps, and `plan` is the
    read's physical plan."""
    import pyarrow as pa

    from tests.services import up
    from tests.services._layout import REPO_ROOT

    up(["iceberg-spark"], testbed)
    python = testbed.iceberg_spark.python()
    folder.mkdir(parents=True, exist_ok=True)
    plan = folder / "iceberg-spark-read.json"
    plan.touch(mode=0o600)  # holds the catalog's credentials
    settings = spark_catalog_settings(catalog_name, properties)
    plan.write_text(
        json.dumps(
            {
                "conf": testbed.iceberg_spark.session_conf(**settings),
                "table": ".".join([catalog_name, *identifier]),
                "out": str(folder),
                "where": where,
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "VIRTUAL_ENV")}
    log = folder / "iceberg-spark-read.log"
    with log.open("wb") as out:
        done = subprocess.run(
            [str(python), "-m", "tests.support.iceberg_spark_reader", str(plan)],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=READ_TIMEOUT,
            check=False,
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise AssertionError(f"Spark's Iceberg read failed ({done.returncode}); {log}:\n{tail}")
    with pa.memory_map(str(folder / "rows.arrow")) as source:
        rows = pa.ipc.open_file(source).read_all()
    meta = json.loads((folder / "metadata.json").read_text())
    return SparkRead(rows, meta["data_files"], meta["snapshots"], meta.get("plan", ""))


def _child(plan_file: Path) -> None:
    """In the pyspark 4.1 interpreter: read the plan's table, write what was read. Imports
    only pyspark and pyarrow: the durable-sinks installed there may be older than the
    checkout."""
    import pyarrow as pa
    from pyspark.sql import SparkSession

    plan = json.loads(plan_file.read_text())
    out = Path(plan["out"])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder: Any = SparkSession.builder.appName("iceberg-spark-read")
    for key, value in plan["conf"].items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        table = plan["table"]
        read = session.table(table)
        physical = ""
        if plan.get("where"):
            read = read.where(plan["where"])
            physical = str(read._jdf.queryExecution().executedPlan().toString())
        rows = read.toArrow()
        with (
            pa.OSFile(str(out / "rows.arrow"), "wb") as sink,
            pa.ipc.new_file(sink, rows.schema) as writer,
        ):
            writer.write_table(rows)
        files = [r.file_path for r in session.sql(f"SELECT file_path FROM {table}.files").collect()]
        snapshots = [
            dict(r.summary or {})
            for r in session.sql(
                f"SELECT summary FROM {table}.snapshots ORDER BY committed_at"
            ).collect()
        ]
        (out / "metadata.json").write_text(
            json.dumps({"data_files": sorted(files), "snapshots": snapshots, "plan": physical})
        )
    finally:
        session.stop()


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
