"""What a type checker tells a user about a job script: `mypy --strict`, run as a user would
(from the test's virtualenv, on a script in a folder of its own, with the installed package),
refuses a misspelt option of a typed configuration, naming it, and passes the same script
spelt right, where every built-in kind's typed configuration is a sink as it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
from durable_sinks import Delta, Files, Iceberg, Kafka, Postgres, durable_sink, sink
from durable_sinks.sinks.folder import Jsonl

postgres = Postgres(dsn="host=db dbname=app", {table}="events", mode="upsert", key=("id",))
kafka = Kafka(bootstrap_servers="broker:9092", topic="events", transaction_timeout_s=90.0)
one = durable_sink(postgres, job_id="orders", decision_store="/data/decisions")
both = durable_sink([postgres, sink(kafka)], job_id="orders", outage_tolerance_s=300.0)
lake = Iceberg(table="events", namespace="lake", catalog={{"type": "sql"}})
delta = Delta(path="/lake/orders", mode="upsert", key=("order_id",))
alone = durable_sink(lake, job_id="lake", decision_store="/data/decisions")
tables = durable_sink(
    [lake, delta, Jsonl(path="/data/jsonl")],
    job_id="lake",
    dead_letter=Files(path="/data/dead"),
)
"""


def _mypy(tmp_path: Path, table: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / f"job_{table}.py"
    script.write_text(SCRIPT.format(table=table))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(tmp_path / "mypy-cache"),
            "--config-file",
            str(tmp_path / "no-config.ini"),
            script.name,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_mypy_names_a_misspelt_option_and_passes_the_right_one(tmp_path: Path) -> None:
    # Not the repository's settings; Spark's own modules are not analysed (they are not what
    # is checked here, and analysing them is most of a cold run's time).
    (tmp_path / "no-config.ini").write_text(
        "[mypy]\n[mypy-pyspark.*]\nfollow_imports = skip\n[mypy-py4j.*]\nfollow_imports = skip\n"
    )
    wrong = _mypy(tmp_path, "tabel")
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert 'Unexpected keyword argument "tabel" for "Postgres"' in wrong.stdout, wrong.stdout
    assert 'did you mean "table"' in wrong.stdout, wrong.stdout
    # The same script spelt right passes (reusing the first run's cache: a second or so).
    right = _mypy(tmp_path, "table")
    assert right.returncode == 0, right.stdout + right.stderr
    assert "Success: no issues found in 1 source file" in right.stdout, right.stdout
