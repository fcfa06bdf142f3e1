"""Validation when the foreachBatch function is built: every error raises before the query
starts, names the problem and the fix, leaks no secret, and leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from durable_sinks import __version__
from durable_sinks.core.errors import CapabilityError, ConfigError, DurableSinkError
from durable_sinks.manifest import HostedDecisionStore, LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.spark import JobOptions, durable_sink, sink
from durable_sinks.spark._build import decision_store
from durable_sinks.spark._worker_check import check_workers
from tests.services import KafkaEndpoint, PostgresEndpoint
from tests.support.venvs import venv_with_our_dependencies

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_kafka_in_executor_mode_is_refused_with_the_reason(
    kafka: KafkaEndpoint, kafka_topic: str, job_id: str, tmp_path: Path
) -> None:
    with pytest.raises(CapabilityError, match="distributed_prepare") as caught:
        durable_sink(
            "kafka",
            bootstrap_servers=kafka.bootstrap_servers,
            topic=kafka_topic,
            job_id=job_id,
            decision_store=str(tmp_path / "decisions"),
            execution="executor",
        )
    assert caught.value.sink == "kafka"
    assert caught.value.fix is not None
    assert "driver mode" in caught.value.fix


def test_a_job_whose_sinks_cannot_host_decisions_must_name_a_store(
    job_id: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="needs a decision store") as caught:
        durable_sink("files", path=str(tmp_path / "out"), job_id=job_id)
    assert caught.value.fix is not None
    assert "decision_store=" in caught.value.fix
    kafka = sink("kafka", bootstrap_servers="127.0.0.1:1", topic="t")
    with pytest.raises(ConfigError, match="needs a decision store"):
        decision_store([sink("files", path=str(tmp_path / "out")), kafka], JobOptions(job_id))


def test_a_lone_kafka_or_delta_sink_keeps_the_decisions_of_a_job_naming_no_store(
    job_id: str, tmp_path: Path
) -> None:
    kafka = sink("kafka", bootstrap_servers="127.0.0.1:1", topic="t", name="orders")
    hosted = decision_store([kafka], JobOptions(job_id))
    assert isinstance(hosted, HostedDecisionStore)
    assert hosted.sink == "orders"
    hosted.close()
    delta = sink("delta", path=str(tmp_path / "table"), create_table=True)
    beside = decision_store([delta], JobOptions(job_id))
    assert isinstance(beside, LocalDirectoryStore)
    assert beside.path == tmp_path / "table" / "_decisions"
    named = decision_store([kafka], JobOptions(job_id, decision_store=str(tmp_path / "d")))
    assert isinstance(named, LocalDirectoryStore)


def test_kafka_sinks_on_two_clusters_are_refused(
    kafka: KafkaEndpoint, kafka_topic: str, job_id: str, tmp_path: Path
) -> None:
    """Named by other bootstrap servers, the second sink's cluster counts as another: two
    transactions, and only one can carry the decision."""
    port = kafka.bootstrap_servers.rsplit(":", 1)[1]
    with pytest.raises(CapabilityError, match="do not share one transaction") as caught:
        durable_sink(
            [
                sink("kafka", bootstrap_servers=kafka.bootstrap_servers, topic=kafka_topic),
                sink(
                    "kafka",
                    name="kafka2",
                    bootstrap_servers=f"localhost:{port}",
                    topic=kafka_topic,
                    progress_topic=f"{kafka_topic}-p2",
                ),
            ],
            job_id=job_id,
            decision_store=str(tmp_path / "decisions"),
        )
    assert f"'kafka2': kafka cluster localhost:{port}" in caught.value.message
    assert "one job per cluster" in (caught.value.fix or "")


def test_a_kafka_dead_letter_topic_on_another_cluster_is_refused_with_the_fix(
    kafka: KafkaEndpoint, kafka_topic: str, job_id: str, tmp_path: Path
) -> None:
    port = kafka.bootstrap_servers.rsplit(":", 1)[1]
    with pytest.raises(CapabilityError, match="dead-letter sink 'dead_letters'") as caught:
        durable_sink(
            "kafka",
            bootstrap_servers=kafka.bootstrap_servers,
            topic=kafka_topic,
            job_id=job_id,
            decision_store=str(tmp_path / "decisions"),
            on_bad_rows="dead_letter",
            dead_letter=sink(
                "kafka",
                bootstrap_servers=f"localhost:{port}",
                topic=f"{kafka_topic}-dlq",
                create_topic=True,
            ),
        )
    assert "the same bootstrap_servers" in (caught.value.fix or "")
    assert "dead_letter=sink('postgres'" in (caught.value.fix or "")


def test_a_wrong_password_is_named_without_showing_it(
    postgres: PostgresEndpoint, pg_schema: str, job_id: str
) -> None:
    wrong = "not-the-password-" + job_id[-6:]
    dsn = postgres.conninfo(password=wrong)
    with pytest.raises(DurableSinkError) as caught:
        durable_sink("postgres", dsn=dsn, table=f"{pg_schema}.events", job_id=job_id)
    text = str(caught.value)
    assert "password authentication failed" in text or "authentication" in text
    assert wrong not in text
    assert postgres.password not in text


def test_an_unreachable_server_is_a_clear_error_before_the_query_starts(
    job_id: str, tmp_path: Path
) -> None:
    with pytest.raises(DurableSinkError, match=r"127\.0\.0\.1") as caught:
        durable_sink(
            "postgres",
            dsn="host=127.0.0.1 port=1 dbname=x user=u password=secret-pw connect_timeout=2",
            table="events",
            job_id=job_id,
            decision_store=str(tmp_path / "decisions"),
        )
    assert "secret-pw" not in str(caught.value)
    assert caught.value.fix is not None


def test_executor_mode_needs_sinks_as_options_it_can_ship_to_executors(
    job_id: str, tmp_path: Path
) -> None:
    built = FolderSink(Files(str(tmp_path / "out")))
    with pytest.raises(ConfigError, match="builds its sinks on the executors") as caught:
        durable_sink(
            [built], job_id=job_id, execution="executor", decision_store=str(tmp_path / "d")
        )
    assert caught.value.fix is not None
    assert "sink(kind" in caught.value.fix


def test_executor_mode_refuses_workers_without_the_package_before_any_batch(
    job_id: str, tmp_path: Path
) -> None:
    """Spark's Python workers run an interpreter that lacks durable-sinks: `durable_sink(...,
    execution="executor")` refuses with the fix, in a Spark of its own (the workers'
    interpreter is fixed per SparkContext), and nothing is written."""
    python = venv_with_our_dependencies(tmp_path / "worker-venv")
    lacks = subprocess.run([str(python), "-c", "import durable_sinks"], capture_output=True)
    assert lacks.returncode != 0, "the worker interpreter must lack durable-sinks"
    output, store = tmp_path / "out", tmp_path / "decisions"
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "worker_python": str(python),
                "output": str(output),
                "store": str(store),
                "job_id": job_id,
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.foreign_worker_child", str(plan)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["error"] == "ConfigError", outcome
    assert str(python) in outcome["message"], outcome
    assert "No module named 'durable_sinks'" in outcome["message"], outcome
    assert "PYSPARK_PYTHON" in outcome["fix"], outcome
    assert not list(output.glob("epoch=*")), "nothing may be published"
    decided = [p for p in store.rglob("*.json") if p.name != "layout.json"]  # the layout file
    assert not decided, "nothing may be decided"


def test_executor_mode_refuses_workers_with_another_version(spark: SparkSession) -> None:
    """The worker check against the test bed's Spark: the same version passes, and another
    patch release of it; another MAJOR.MINOR is refused naming both."""
    check_workers(spark, [("files", {"path": "/unused"})], job="j", version=__version__)
    other_patch = ".".join([*__version__.split(".")[:2], "999"])
    check_workers(spark, [], job="j", version=other_patch)
    with pytest.raises(
        ConfigError, match=r"have durable-sinks .*; the driver has 0\.0\.0, which runs only"
    ) as caught:
        check_workers(spark, [], job="j", version="0.0.0")
    assert caught.value.fix is not None
    with pytest.raises(ConfigError, match="no sink kind 'nosuch'"):
        check_workers(spark, [("nosuch", {})], job="j", version=__version__)
