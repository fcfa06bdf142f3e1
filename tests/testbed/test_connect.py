"""The test bed's Spark Connect servers (tests/services/connect.py): the shared one answers
remote queries, runs server-side Python in this interpreter and has the extra jars; the
killable one leaves no process and no port behind when stopped or killed, and comes back.
Clients run in child processes (tests/support/connect_client.py): the last tests show why."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Consumer

from tests.services import (
    DEFAULT_UP,
    NAMES,
    ON_DEMAND,
    KafkaEndpoint,
    Layout,
    ServiceError,
    SparkConnect,
    Testbed,
)
from tests.services._layout import REPO_ROOT
from tests.services._process import descendants, pid_alive, port_accepts, port_is_free
from tests.services.connect import START_TIMEOUT
from tests.support.connect_client import ConnectClient, ConnectClientError
from tests.testbed.test_lifecycle import PRIVATE_OFFSET, _squat

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# -- what the clients run (in their own processes; sent to the server by value) --------------


def count_range(spark: SparkSession, n: int) -> int:
    return spark.range(n).count()


def server_side_python(spark: SparkSession) -> list[str]:
    """Where a UDF runs: the worker's interpreter prefix and the durable_sinks it imports."""
    from pyspark.sql.functions import udf

    @udf("string")
    def where(_: int) -> str:
        import sys

        import durable_sinks

        return f"{sys.prefix}|{durable_sinks.__file__}"

    row = spark.range(1).select(where("id").alias("where")).first()
    assert row is not None
    return str(row["where"]).split("|")


def foreach_batch_reports(spark: SparkSession, source: str, checkpoint: str, out: str) -> None:
    """A streaming query whose foreachBatch function (server-side, in Connect) writes, per
    batch, its interpreter prefix, the durable_sinks it imports and the batch's row count."""

    def report(batch: DataFrame, batch_id: int) -> None:
        import sys

        import durable_sinks

        facts = {"prefix": sys.prefix, "module": durable_sinks.__file__, "rows": batch.count()}
        Path(out, f"{batch_id}.json").write_text(json.dumps(facts))

    query = (
        spark.readStream.schema("id long")
        .json(source)
        .writeStream.foreachBatch(report)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert query.exception() is None, query.exception()


def write_to_kafka(spark: SparkSession, bootstrap: str, topic: str) -> None:
    frame = spark.createDataFrame([("k1", "v1"), ("k2", "v2")], "key string, value string")
    frame.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option(
        "topic", topic
    ).save()


def slow_query(spark: SparkSession, seconds: float) -> str:
    """A query that runs for `seconds` (a sleeping UDF); what it returned or raised."""
    from pyspark.sql.functions import udf

    @udf("long")
    def sleepy(x: int) -> int:
        import time

        time.sleep(seconds)
        return x

    try:
        rows = spark.range(2).repartition(2).select(sleepy("id").alias("x")).collect()
    except Exception as exc:  # noqa: BLE001 (what the server's death looks like is the result)
        return f"{type(exc).__name__}: {exc}"
    return f"{len(rows)} rows"


# -- the shared server ------------------------------------------------------------------------


def test_status_line_names_the_url_and_says_it_answers(
    testbed: Testbed, spark_connect: str
) -> None:
    assert spark_connect == f"sc://127.0.0.1:{testbed.layout.connect.port}"
    line = testbed.connect.status().line()
    assert re.fullmatch(
        rf"connect +running \(pid \d+\) +{re.escape(spark_connect)} local\[2\], driver 1g "
        r"\(answering\)",
        line,
    ), line
    done = subprocess.run(
        [sys.executable, "-m", "tests.services", "status"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert line.split("(pid")[0] in done.stdout, done.stdout
    assert re.search(r"^faults-connect +", done.stdout, re.MULTILINE), done.stdout


def test_answers_a_remote_query(connect_client: ConnectClient) -> None:
    assert connect_client.run(count_range, 5) == 5
    # `up` and `status` asked the server in this process without a session: still classic.
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ
    assert "SPARK_REMOTE" not in os.environ


def test_server_side_python_is_this_interpreter_with_durable_sinks(
    connect_client: ConnectClient, tmp_path: Path
) -> None:
    import durable_sinks

    prefix, module = connect_client.run(server_side_python)
    assert prefix == sys.prefix
    assert module == durable_sinks.__file__

    source, out = tmp_path / "source", tmp_path / "out"
    source.mkdir()
    out.mkdir()
    (source / "0.json").write_text("".join(f'{{"id": {i}}}\n' for i in range(3)))
    connect_client.run(foreach_batch_reports, str(source), str(tmp_path / "checkpoint"), str(out))
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert reports == [{"prefix": sys.prefix, "module": durable_sinks.__file__, "rows": 3}]


@pytest.mark.slow
def test_kafka_connector_is_on_the_server(
    connect_client: ConnectClient, kafka: KafkaEndpoint, kafka_topic: str
) -> None:
    connect_client.run(write_to_kafka, kafka.bootstrap_servers, kafka_topic)
    consumer = Consumer(kafka.config({"group.id": kafka_topic, "auto.offset.reset": "earliest"}))
    try:
        consumer.subscribe([kafka_topic])
        records: list[tuple[bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 30
        while len(records) < 2 and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                records.append((message.key(), message.value()))
    finally:
        consumer.close()
    assert sorted(records) == [(b"k1", b"v1"), (b"k2", b"v2")]


def test_up_without_names_starts_the_shared_server_but_not_the_killable_one() -> None:
    testbed = Testbed.create()
    on_demand = ("faults-connect", "spark-cluster", "postgres-standby", "kafka-cluster")
    assert set(ON_DEMAND) == set(on_demand)
    assert [s.name for s in testbed.select(None, DEFAULT_UP)] == [
        n for n in NAMES if n not in on_demand
    ]
    assert "connect" in DEFAULT_UP
    assert [s.name for s in testbed.select()] == list(NAMES)  # down, status and reset: all
    assert testbed.faults_connect.port == testbed.layout.connect.killable
    assert testbed.faults_connect.home != testbed.connect.home


@pytest.mark.usefixtures("private_ports")
def test_taken_port_is_named_in_the_error(tmp_path: Path) -> None:
    layout = Layout.from_env().shifted(PRIVATE_OFFSET, tmp_path / "services")
    server = SparkConnect(layout)
    with _squat(server.port), pytest.raises(ServiceError) as raised:
        server.up()
    message = str(raised.value)
    assert f"port {server.port}" in message
    assert "already in use" in message
    assert server.pid() is None


# -- the killable server ----------------------------------------------------------------------


def _processes(server: SparkConnect) -> list[int]:
    pid = server.pid()
    assert pid is not None
    return [pid, *descendants(pid)]


def _assert_gone(server: SparkConnect, processes: list[int]) -> None:
    assert server.pid() is None
    assert [p for p in processes if pid_alive(p)] == []
    assert port_is_free(server.port), f"port {server.port} still held"
    assert not port_accepts(server.port)


@pytest.mark.slow
@pytest.mark.fault_tier  # the default suite's tests/spark/test_connect.py takes it down and up
def test_killable_server_down_leaves_nothing_and_up_brings_it_back(
    killable_connect: SparkConnect, tmp_path: Path
) -> None:
    server = killable_connect
    assert server.port != Testbed.create().connect.port
    client = ConnectClient(server.url, folder=tmp_path)
    assert client.run(server_side_python)[0] == sys.prefix  # Python workers exist now
    processes = _processes(server)
    # PySpark's worker daemon makes a process group of its own: `down` must find it.
    groups = {os.getpgid(p) for p in processes if pid_alive(p)}
    assert len(groups) > 1, processes

    server.down()
    _assert_gone(server, processes)
    line = server.status().line()
    assert re.fullmatch(rf"faults-connect +stopped +{re.escape(server.url)} .*", line), line
    server.down()  # twice is harmless

    server.up()
    assert client.run(count_range, 3) == 3


@pytest.mark.slow
@pytest.mark.fault_tier  # the default suite's tests/spark/test_connect.py kills it too
def test_killed_server_fails_its_client_and_comes_back_with_up(
    killable_connect: SparkConnect, tmp_path: Path
) -> None:
    server = killable_connect
    client = ConnectClient(server.url, retry_seconds=5, folder=tmp_path)
    assert client.run(count_range, 1) == 1
    running = client.start(slow_query, 60.0)
    time.sleep(6)  # the query is running (the client needs ~2 s to start)
    processes = _processes(server)
    started = time.monotonic()
    server.kill()
    assert time.monotonic() - started < 5
    _assert_gone(server, processes)
    outcome = running.result(timeout=120)
    assert "UNAVAILABLE" in outcome, outcome

    started = time.monotonic()
    server.up()
    restart = time.monotonic() - started
    assert restart < START_TIMEOUT
    assert client.run(count_range, 2) == 2


@pytest.mark.slow
@pytest.mark.fault_tier  # the default suite's tests/spark/test_connect.py kills it too
def test_a_client_whose_server_restarted_meanwhile_has_lost_its_session(
    killable_connect: SparkConnect, tmp_path: Path
) -> None:
    """A client retries (here up to 60 s) while the server is down; a server back within that
    time knows nothing of its session or operation: the query fails, it is not resumed."""
    server = killable_connect
    client = ConnectClient(server.url, retry_seconds=60, folder=tmp_path)
    running = client.start(slow_query, 60.0)
    time.sleep(6)
    server.kill()
    server.up()
    outcome = running.result(timeout=180)
    assert "SESSION_NOT_FOUND" in outcome, outcome


def test_up_refuses_a_server_started_by_another_interpreter(
    killable_connect: SparkConnect,
) -> None:
    server = killable_connect
    recorded = server.state_file.read_text()
    other = {**json.loads(recorded), "prefix": "/elsewhere/.venv", "python": "/elsewhere/python"}
    server.state_file.write_text(json.dumps(other))
    try:
        with pytest.raises(ServiceError, match="another checkout's durable-sinks"):
            server.up()
    finally:
        server.state_file.write_text(recorded)
    server.up()


# -- why clients run in child processes -------------------------------------------------------

_CLASSIC_THEN_REMOTE = """
    from pyspark.sql import SparkSession
    from tests.services import Testbed
    from tests.support.connect_client import remote_session
    classic = Testbed.create().spark.session("classic-then-remote")
    assert classic.range(2).count() == 2
    try:
        SparkSession.builder.remote(URL).getOrCreate()
    except Exception as exc:
        print("remote:", getattr(exc, "getErrorClass", lambda: type(exc).__name__)())
    try:
        remote_session(URL)
    except RuntimeError as exc:
        print("remote_session:", exc)
    print("classic still works:", classic.range(3).count())
"""

_REMOTE_THEN_CLASSIC = """
    import os
    from pyspark.sql import SparkSession
    remote = SparkSession.builder.remote(URL).getOrCreate()
    assert remote.range(2).count() == 2
    remote.stop()
    print("after stop:", os.environ.get("SPARK_CONNECT_MODE_ENABLED"))
    try:
        SparkSession.builder.master("local[1]").getOrCreate()
    except Exception as exc:
        print("classic:", getattr(exc, "getErrorClass", lambda: type(exc).__name__)())
"""


def _script(body: str, url: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", f"URL = {url!r}\n" + textwrap.dedent(body)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
@pytest.mark.fault_tier  # a test-bed self-test (14 s)
def test_classic_and_remote_sessions_cannot_share_a_process(spark_connect: str) -> None:
    """What tests/support/connect_client.py works around (pyspark 4.2). If this fails
    because pyspark changed, revisit whether Connect clients still need a process of their
    own (docs/testbed.md, "Spark Connect")."""
    classic_first = _script(_CLASSIC_THEN_REMOTE, spark_connect)
    assert "remote: SESSION_ALREADY_EXIST" in classic_first, classic_first
    assert "remote_session: this process runs a classic SparkSession" in classic_first
    assert "classic still works: 3" in classic_first

    remote_first = _script(_REMOTE_THEN_CLASSIC, spark_connect)
    assert "after stop: 1" in remote_first, remote_first
    assert "classic: CONNECT_URL_NOT_SET" in remote_first, remote_first


def test_a_client_function_must_be_importable(connect_client: ConnectClient) -> None:
    def local(spark: SparkSession) -> int:
        return 1

    with pytest.raises(ValueError, match="not importable by name"):
        connect_client.start(local)


def test_a_failing_client_raises_with_its_traceback(connect_client: ConnectClient) -> None:
    with pytest.raises(ConnectClientError, match=r"TABLE_OR_VIEW_NOT_FOUND"):
        connect_client.run(count_missing_table)


def count_missing_table(spark: SparkSession) -> int:
    return spark.table("no_such_table_anywhere").count()
