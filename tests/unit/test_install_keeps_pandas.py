"""Installing durable-sinks into a managed Spark runtime's Python keeps its pandas: the package
never imports pandas, and its requirement is pyspark's own (`pyspark[sql]`), so the pandas
and numpy that a runtime ships with pyspark 3.5 (tests/services/compat.py, MANAGED: pandas
1.5.3, numpy 1.23.5) satisfy it, and both Arrow reads work on them.

A fresh virtualenv on the runtime's Python gets the runtime's packages (from pip's cache, else
the package index), then `pip install '<wheel>[postgres]'`; pyspark, pandas and numpy must be
the versions installed before. In it, with local Spark: durable-sinks imports, a Postgres
sink's configuration is built and its extra found, pyspark's own pandas check passes, and the
socket read (driver mode) and the partitions read (mapInArrow, pyspark's pandas UDF machinery)
give every row, with the content digest (core/content.py, numpy over the Arrow buffers) that
this environment's numpy gives the same rows. A requirement on a newer pandas or numpy than
the runtime's fails here.

Marked `compat_tier`: `make test-compat` runs it (tests/compat_lanes.py), as `make test-fresh`
does; the default suite deselects it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

from durable_sinks.core.content import summarise
from tests.services._process import ServiceError
from tests.services.compat import MANAGED, find_python
from tests.support.venvs import build_wheel
from tests.unit.test_install_keeps_spark import WHEEL_ENV

#: What must not change: the runtime's packages, by distribution name.
KEPT = tuple(requirement.split("==")[0] for requirement in MANAGED.packages)
TIMEOUT = 900

VERSIONS = """
import json, sys
from importlib.metadata import version
print(json.dumps({name: version(name) for name in sys.argv[1:]}))
"""

#: The rows read through Spark: `id` 0 to ROWS - 1 and `s`, its decimal string.
ROWS = 1000
#: Run in the runtime's virtualenv after the install, with ROWS as its argument; prints one
#: JSON line.
PROBE = """
import json
import sys
import durable_sinks
from durable_sinks import Postgres
from durable_sinks.core.content import summarise
from durable_sinks.core.extras import needs_extra
from durable_sinks.spark._arrow import partition_batches, socket_batches
from pyspark.sql import SparkSession
from pyspark.sql.pandas.utils import require_minimum_pandas_version

config = Postgres(dsn="postgresql://spark@db.internal/shop", table="events")
with needs_extra("postgres", "the postgres sink"):
    import pgpq, psycopg
require_minimum_pandas_version()
spark = (
    SparkSession.builder.master("local[2]")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .getOrCreate()
)
try:
    df = spark.range(0, int(sys.argv[1]), numPartitions=3)
    df = df.selectExpr("id", "cast(id as string) AS s")
    reads = {
    "socket": str(summarise(socket_batches(df, job="managed-runtime"))),
        "partitions": str(summarise(partition_batches(df))),
    }
finally:
    spark.stop()
print(json.dumps({"package": durable_sinks.__file__, "table": config.table, **reads}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get(WHEEL_ENV)
    if given:
        return Path(given)
    return build_wheel(tmp_path_factory.mktemp("clone"), tmp_path_factory.mktemp("dist"))


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT, check=False, env=env
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


def _versions(python: Path) -> dict[str, str]:
    found: dict[str, str] = json.loads(_run([str(python), "-c", VERSIONS, *KEPT]))
    return found


@pytest.mark.slow
@pytest.mark.compat_tier
def test_pip_install_into_a_managed_runtime_keeps_its_pandas_pyspark_and_numpy(
    wheel: Path, tmp_path: Path
) -> None:
    try:
        interpreter = find_python(MANAGED.python)
    except ServiceError as exc:
        pytest.fail(f"the {MANAGED.name} runtime ({MANAGED.describe()}) needs it: {exc}")
    _run([str(interpreter), "-m", "venv", str(tmp_path / "venv")])
    python = tmp_path / "venv" / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run([*pip, "install", "--quiet", *MANAGED.packages])
    before = _versions(python)
    assert before == dict(p.split("==") for p in MANAGED.packages), before

    _run([*pip, "install", f"{wheel}[postgres]"])

    assert _versions(python) == before, "pip replaced a package the runtime ships"
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "VIRTUAL_ENV")}
    env.update(PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
    lines = _run([str(python), "-c", PROBE, str(ROWS)], env=env).strip().splitlines()
    seen = json.loads(lines[-1])
    assert seen["package"].startswith(str(tmp_path)), seen  # the wheel, not this checkout
    assert seen["table"] == "events"
    expected = summarise([_rows()])
    assert expected.rows == ROWS
    assert (seen["socket"], seen["partitions"]) == (str(expected), str(expected)), seen


def _rows() -> pa.RecordBatch:
    """The rows the probe reads, as Spark's Arrow schema types them."""
    ids = list(range(ROWS))
    return pa.record_batch(
        [pa.array(ids, pa.int64()), pa.array([str(i) for i in ids], pa.string())],
        names=["id", "s"],
    )
