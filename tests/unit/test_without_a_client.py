"""An install without the `kafka` extra, for real: a virtualenv that has every package of
this one except confluent-kafka (its package, .dist-info and bundled librdkafka) and orjson.
Asking for a Kafka sink there is a ConfigError naming `durable-sinks[kafka]`, from the
Python API (by kind or as a typed `Kafka(...)` configuration) and from the command line,
while the files sink builds as usual. The typed configurations import and build there,
loading no client.

The virtualenv is made without pip and without the package index: its site-packages links
to this one's entries (tests/support/venvs.py), so it takes a second or two.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.venvs import venv_without

REPO = Path(__file__).resolve().parents[2]

#: Run by the new venv's Python: each way of asking for a Kafka sink, then a files sink.
PROBE = """
import importlib.util, json, sys
from durable_sinks import Delta, Files, Kafka, Postgres, S3, durable_sink, sink, sinks
from durable_sinks.core.errors import ConfigError
import durable_sinks

kafka = {"bootstrap_servers": "localhost:9092", "topic": "events"}
CLIENTS = (
    "confluent_kafka", "orjson", "psycopg", "pgpq", "boto3", "botocore", "deltalake", "pyspark"
)
loaded_by_import = sorted(m for m in sys.modules if m.split(".")[0] in CLIENTS)
folder = sys.argv[1]
typed = Kafka(**kafka, transaction_timeout_s=90.0)
built = [typed, Postgres(dsn="host=db", table="t"), S3(path="s3://lake/p"), Delta(path="/d")]
report = {
    "loaded_by_import": loaded_by_import,
    "durable_sinks": durable_sinks.__file__,
    "confluent_kafka": importlib.util.find_spec("confluent_kafka") is not None,
    "typed": repr(typed),
    "loaded_by_configs": sorted(m for m in sys.modules if m.split(".")[0] in CLIENTS),
    "errors": {},
}
asks = {
    "durable_sink": lambda: durable_sink(
        "kafka", job_id="orders", decision_store=folder + "/decisions", **kafka
    ),
    "sink": lambda: sink("kafka", **kafka),
    "create": lambda: sinks.create("kafka", kafka),
    "durable_sink(Kafka)": lambda: durable_sink(
        typed, job_id="orders", decision_store=folder + "/decisions"
    ),
    "sink(Kafka)": lambda: sink(typed),
    "[Files, Kafka]": lambda: durable_sink(
        [Files(path=folder + "/out"), typed], job_id="orders", decision_store=folder + "/d"
    ),
}
for name, ask in asks.items():
    try:
        ask()
    except ConfigError as exc:
        report["errors"][name] = str(exc)
report["files"] = sink("files", path=folder + "/out", name="out").build().name
report["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] == "confluent_kafka")
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def python_without_kafka(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a venv that is this one without the kafka extra's modules."""
    python, left_out = venv_without(
        tmp_path_factory.mktemp("no-kafka") / "venv",
        lambda name: name.split("-")[0] in ("confluent_kafka", "confluent_kafka.libs", "orjson"),
    )
    # This venv has the client (dev installs every extra): something must have been left out,
    # or the test would prove nothing.
    assert any(name.endswith(".dist-info") for name in left_out), left_out
    assert "confluent_kafka" in left_out, left_out
    assert "orjson" in left_out, left_out
    return python


def _run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1", "HOME": str(cwd)},
    )


def test_a_kafka_sink_without_confluent_kafka_names_the_extra(
    python_without_kafka: Path, tmp_path: Path
) -> None:
    done = _run(python_without_kafka, "-c", PROBE, str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # This checkout's durable_sinks, through the editable install, and no client at all.
    assert report["durable_sinks"].startswith(str(REPO / "build")), report["durable_sinks"]
    assert report["confluent_kafka"] is False
    assert report["loaded"] == []
    # Importing the typed configurations loaded no client (nor Spark); building them loaded
    # none but psycopg, installed here, which reads the Postgres DSN.
    assert report["loaded_by_import"] == []
    assert {m.split(".")[0] for m in report["loaded_by_configs"]} <= {"psycopg"}
    assert report["typed"].startswith("Kafka(bootstrap_servers='localhost:9092'")
    assert set(report["errors"]) == {
        "durable_sink",
        "sink",
        "create",
        "durable_sink(Kafka)",
        "sink(Kafka)",
        "[Files, Kafka]",
    }, report
    for name, message in report["errors"].items():
        assert "the kafka sink needs the confluent_kafka module" in message, (name, message)
        assert "pip install 'durable-sinks[kafka]'" in message, (name, message)
    assert report["files"] == "out"
    assert not (tmp_path / "decisions").exists()  # refused before anything was created
    assert not (tmp_path / "d").exists()


def test_the_command_line_without_confluent_kafka_names_the_extra(
    python_without_kafka: Path, tmp_path: Path
) -> None:
    done = _run(
        python_without_kafka,
        "-m",
        "durable_sinks.cli",
        "status",
        "orders",
        "--kind",
        "kafka",
        "-o",
        "bootstrap_servers=localhost:9092",
        "-o",
        "topic=events",
        "--store",
        str(tmp_path / "decisions"),
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'durable-sinks[kafka]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
