"""How a writer travels to a Spark Connect server (spark/_shipping.py), and how a batch tells a
Connect DataFrame from a classic one (spark/_session.py). Pure logic: no Spark, no servers;
the Connect paths themselves run against a real Connect server in tests/spark/test_connect.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

import durable_sinks
from durable_sinks.core.errors import ConfigError
from durable_sinks.spark import DurableBatchWriter, JobOptions, sink
from durable_sinks.spark._session import is_connect
from durable_sinks.spark._shipping import shipped


def _ship(obj: object) -> bytes:
    """Pickled as Spark Connect's client pickles a foreachBatch function."""
    data: bytes = cloudpickle.dumps(obj)  # type: ignore[no-untyped-call]
    return data


def _writer(tmp_path: Path) -> DurableBatchWriter:
    """A writer as a Connect server receives it (built without a Spark session or servers)."""
    writer = DurableBatchWriter.__new__(DurableBatchWriter)
    writer.__setstate__(
        {
            "specs": [sink("files", path=str(tmp_path / "out"))],
            "options": JobOptions("orders", decision_store=str(tmp_path / "decisions")),
        }
    )
    return writer


def test_a_shipped_writer_arrives_as_its_configuration_with_no_coordinator(
    tmp_path: Path,
) -> None:
    writer = _writer(tmp_path)
    copy = cloudpickle.loads(_ship(writer))
    assert type(copy) is DurableBatchWriter
    assert copy.specs == writer.specs
    assert copy.options == writer.options
    assert copy._coordinator is None
    assert copy.last_result is None


def _other_patch(version: str) -> str:
    """Another patch release of `version`'s MAJOR.MINOR."""
    major, minor, *_ = version.split(".")
    return f"{major}.{minor}.999"


def test_a_server_with_another_patch_release_runs_the_writer(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    restore, args = shipped(writer, _other_patch(durable_sinks.__version__), "orders")
    copy = cloudpickle.loads(_ship(restore))(*args)
    assert type(copy) is DurableBatchWriter
    assert copy.options == writer.options


@pytest.mark.parametrize("client", ["0.0.0+client", "9.9.0"])
def test_a_server_with_another_version_refuses_at_the_first_batch(
    tmp_path: Path, client: str
) -> None:
    restore, args = shipped(_writer(tmp_path), client, "orders")
    refuse = cloudpickle.loads(_ship(restore))(*args)
    assert not isinstance(refuse, DurableBatchWriter)
    with pytest.raises(ConfigError) as raised:
        refuse(None, 7)
    error = raised.value
    assert (error.job, error.epoch) == ("orders", 7)
    assert f"has durable-sinks {durable_sinks.__version__}" in error.message
    assert f"the client that started the query has {client}" in error.message
    assert "Nothing was written" in error.message
    assert error.fix is not None
    assert f"durable-sinks=={client}" in error.fix
    assert "PYSPARK_PYTHON" in error.fix


def test_a_server_without_durable_sinks_refuses_at_the_first_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _ship(_writer(tmp_path))
    # Unpickled where durable-sinks cannot be imported: the restorer travelled by value.
    monkeypatch.setitem(sys.modules, "durable_sinks", None)
    refuse = cloudpickle.loads(data)
    monkeypatch.undo()
    assert not isinstance(refuse, DurableBatchWriter)
    with pytest.raises(RuntimeError) as raised:
        refuse(None, 3)
    message = str(raised.value)
    assert message.startswith("[job=orders, epoch=3] ")
    assert "does not have durable-sinks" in message
    assert f"install durable-sinks=={durable_sinks.__version__}" in message


def test_connect_objects_are_told_apart_by_class_without_importing_connect() -> None:
    remote: Any = type("DataFrame", (), {"__module__": "pyspark.sql.connect.dataframe"})()
    classic: Any = type("DataFrame", (), {"__module__": "pyspark.sql.classic.dataframe"})()
    assert is_connect(remote)
    assert not is_connect(classic)
    assert not is_connect(None)
