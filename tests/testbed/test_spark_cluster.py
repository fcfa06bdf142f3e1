"""The Spark standalone cluster (`spark-cluster`): a master and two workers from the pyspark
wheel. `up` twice is harmless and `down` leaves no process (a private cluster on other ports);
a job of a driver in another process runs on both workers, with this interpreter; a killed
executor's tasks run again and its worker starts a replacement; a killed worker comes back and
serves the application again.

Drivers run as child processes (`python -c DRIVER`): a classic SparkSession is one per process,
and pytest-xdist may have given this one a `local[2]` session already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.services import DEFAULT_UP, NAMES, Layout, ServiceError, SparkCluster, Testbed
from tests.services._process import descendants, group_members, pid_alive, port_is_free, tail
from tests.services.spark_cluster import spark_home
from tests.testbed.test_lifecycle import PRIVATE_OFFSET, _all_ports, _private_layout
from tests.testbed.test_s3 import RESTART_OFFSET

#: A driver: opens a session on the cluster with the conf it is given, waits for its two
#: executors, runs a mapInArrow over 4 partitions whose tasks record where they run (a file
#: per task attempt as it starts, then a row), writes what came back to result.json, and
#: (when told to hold) keeps the application running until its stdin is closed.
DRIVER = r"""
import json, os, sys, time
from pathlib import Path

args = json.loads(sys.argv[1])
out = Path(args["out"])
from pyspark.sql import SparkSession

builder = SparkSession.builder.appName(args["name"])
for key, value in args["conf"].items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
sc = spark.sparkContext


def publish(path, text):  # renamed into place: the test reads a file once its name appears
    partial = path.with_name("." + path.name + ".partial")
    partial.write_text(text)
    partial.rename(path)


def executor_count():
    return sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver


def wait_executors(n, timeout=120.0):
    deadline = time.monotonic() + timeout
    while executor_count() < n and time.monotonic() < deadline:
        time.sleep(0.2)
    return executor_count()


wait_executors(2)
publish(out / "ready", sc.applicationId)
sleep = args["sleep"]


def task(batches):
    import pyarrow as pa
    from pyspark import TaskContext

    rows = sum(batch.num_rows for batch in batches)
    context = TaskContext.get()
    pid = os.getpid()  # a Python worker; above it pyspark's daemon, then the executor JVM
    while pid > 1 and b"CoarseGrainedExecutorBackend" not in Path(
        f"/proc/{pid}/cmdline"
    ).read_bytes():
        pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    row = {
        "partition": context.partitionId(),
        "attempt": context.attemptNumber(),
        "rows": rows,
        "executor_pid": pid,
        "cwd": os.getcwd(),  # <worker's work folder>/<application id>/<executor id>
        "python": sys.executable,
    }
    marker = out / f"started-{row['partition']}-{row['attempt']}.json"
    publish(marker, json.dumps(row))
    time.sleep(sleep)
    yield pa.RecordBatch.from_pylist([row])


# Python ints arrive as Arrow int64: longs (an `int` column would fail the task).
schema = (
    "partition long, attempt long, rows long, executor_pid long, cwd string, python string"
)
df = spark.range(0, 40, numPartitions=4).mapInArrow(task, schema)
rows = [r.asDict() for r in df.collect()]
result = {"rows": rows, "application": sc.applicationId}
if args["hold"]:
    result["executors_after"] = wait_executors(2)
publish(out / "result.json", json.dumps(result))
if args["hold"]:
    sys.stdin.read()
spark.stop()
"""

#: What a test process may carry that is no business of a driver's (a session of its own).
_DRIVER_ENV_DROP = (
    "PYSPARK_GATEWAY_PORT",
    "PYSPARK_GATEWAY_SECRET",
    "PYSPARK_SUBMIT_ARGS",
    "SPARK_REMOTE",
    "SPARK_CONNECT_MODE_ENABLED",
    "SPARK_LOCAL_REMOTE",
    "SPARK_API_MODE",
)


@dataclass
class Driver:
    """A driver process of a test's own, on the cluster."""

    proc: subprocess.Popen[bytes]
    folder: Path

    @property
    def log(self) -> Path:
        return self.folder / "driver.log"

    def _fail(self, what: str) -> str:
        return f"{what}\n  driver log: {self.log}\n{tail(self.log, 60)}"

    def _wait_for(self, name: str, timeout: float) -> Path:
        path = self.folder / name
        deadline = time.monotonic() + timeout
        while not path.exists():
            assert self.proc.poll() is None, self._fail(f"driver exited ({self.proc.returncode})")
            assert time.monotonic() < deadline, self._fail(f"no {name} within {timeout:.0f} s")
            time.sleep(0.2)
        return path

    def ready(self, timeout: float = 180.0) -> str:
        """Wait until it has its two executors; its application id."""
        return self._wait_for("ready", timeout).read_text()

    def started(self) -> list[dict[str, Any]]:
        """The task attempts that have started so far."""
        return [json.loads(p.read_text()) for p in sorted(self.folder.glob("started-*.json"))]

    def result(self, timeout: float = 300.0) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self._wait_for("result.json", timeout).read_text())
        return data

    def finish(self, timeout: float = 120.0) -> None:
        """Let a holding driver stop its session, and wait until it exits cleanly."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        code = self.proc.wait(timeout)
        assert code == 0, self._fail(f"driver exited with {code}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def drivers(tmp_path: Path) -> Iterator[list[Driver]]:
    """Drivers a test started; any still running at its end is killed."""
    started: list[Driver] = []
    yield started
    for driver in started:
        driver.kill()


def start_driver(
    cluster: SparkCluster,
    folder: Path,
    drivers: list[Driver],
    *,
    sleep: float = 0.0,
    hold: bool = False,
) -> Driver:
    folder.mkdir(parents=True)
    args = {
        "conf": cluster.driver_conf(),
        "out": str(folder),
        "name": f"durable-sinks-test-{folder.name}",
        "sleep": sleep,
        "hold": hold,
    }
    env = {k: v for k, v in os.environ.items() if k not in _DRIVER_ENV_DROP}
    env.update(cluster.driver_env())
    with (folder / "driver.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER, json.dumps(args)],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=folder,
        )
    driver = Driver(proc, folder)
    drivers.append(driver)
    return driver


def _by_partition(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    assert sorted(r["partition"] for r in rows) == [0, 1, 2, 3], rows
    return {r["partition"]: r for r in rows}


def _worker_of(cluster: SparkCluster, cwd: str) -> int:
    """Which worker an executor ran on, from its folder: work-<i>/<app>/<executor id>."""
    work = Path(cwd).parent.parent
    found = [i for i in range(cluster.workers) if cluster.work_dir(i) == work]
    assert found, f"{cwd} is in no worker's work folder"
    return found[0]


def _wait(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:.0f} s"
        time.sleep(0.2)


# -- the service itself ----------------------------------------------------------------------


def test_ports_are_its_own_and_only_its_fixture_starts_it() -> None:
    """Its six ports (and those of the private cluster below) are wanted by no other server of
    the shared bed, the private beds (+200) or test_s3.py's restart (+400); DS_SPARK_MASTER_PORT
    moves them all. `up` without names leaves it alone; down/status/reset cover it."""
    shared = Layout.from_env()
    private = _private_layout(shared.root / "private")
    others = (
        _all_ports(shared)
        + _all_ports(private)
        + list(shared.shifted(RESTART_OFFSET, shared.root / "restart").s3.all().values())
    )
    mine = [*shared.spark_cluster.all().values(), *private.spark_cluster.all().values()]
    assert len(set(mine)) == len(mine) == 12, mine
    assert sorted(set(mine) & set(others)) == []
    assert shared.spark_cluster.shifted(PRIVATE_OFFSET) == private.spark_cluster

    assert "spark-cluster" in NAMES
    assert "spark-cluster" not in DEFAULT_UP
    testbed = Testbed.create()
    assert testbed.select(["spark-cluster"]) == [testbed.spark_cluster]
    assert testbed.spark_cluster in testbed.select()


def test_ports_follow_the_master_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_SPARK_MASTER_PORT", "27077")
    ports = Layout.from_env().spark_cluster
    assert ports.all() == {
        "master": 27077,
        "worker-0": 27078,
        "worker-1": 27079,
        "master.webui": 27080,
        "worker-0.webui": 27081,
        "worker-1.webui": 27082,
    }
    monkeypatch.setenv("DS_SPARK_MASTER_WEBUI_PORT", "27180")
    monkeypatch.setenv("DS_SPARK_WORKER_PORT", "27190")
    monkeypatch.setenv("DS_SPARK_WORKER_WEBUI_PORT", "27290")
    ports = Layout.from_env().spark_cluster
    assert (ports.master_webui, ports.workers, ports.worker_webuis) == (
        27180,
        (27190, 27191),
        (27290, 27291),
    )


@pytest.mark.usefixtures("private_ports")
def test_up_refuses_a_cluster_started_from_another_spark(tmp_path: Path) -> None:
    """A running cluster whose SPARK_HOME is gone (a removed worktree that shared
    DS_SERVICES_DIR) or of another pyspark version is named, with the way out, never used.
    No JVM here: the "master" is this process."""
    cluster = SparkCluster(_private_layout(tmp_path / "services"))
    cluster.home.mkdir(parents=True)
    cluster.master_pid_file.write_text(f"{os.getpid()}\n")
    try:
        for state, expected in (
            ({"spark_home": str(tmp_path / "gone"), "pyspark": "4.2.0"}, "no longer exists"),
            ({"spark_home": str(spark_home()), "pyspark": "3.5.0"}, "runs Spark 3.5.0"),
        ):
            cluster.state_file.write_text(json.dumps({"python": "/elsewhere/python", **state}))
            with pytest.raises(ServiceError) as refused:
                cluster.up()
            message = str(refused.value)
            assert expected in message
            assert "/elsewhere/python" in message
            assert "down spark-cluster" in message
    finally:
        cluster.master_pid_file.unlink()  # nothing may ever stop "the master", this process


@pytest.mark.usefixtures("private_ports")
@pytest.mark.slow
@pytest.mark.fault_tier  # the test bed's own lifecycle; `make test-fresh` starts it from nothing
def test_up_twice_is_harmless_and_down_leaves_nothing(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    """On a private cluster (ports + 200, folder in tmp_path): `up` starts three JVMs and
    returns with both workers ALIVE; a second `up` keeps them; `down`, with an application
    running (executor JVMs and pyspark's daemons below the workers, in groups of their own),
    leaves no process and no port; `down` twice is harmless."""
    layout = _private_layout(tmp_path / "services")
    cluster = SparkCluster(layout)
    assert all(port_is_free(p) for p in layout.spark_cluster.all().values())
    try:
        started = time.monotonic()
        cluster.up()
        took = time.monotonic() - started
        print(f"private cluster up in {took:.1f} s")
        assert took < 60
        first = [cluster.master_pid(), *(cluster.worker_pid(i) for i in range(2))]
        assert all(first), first
        assert cluster.workers_alive() == [0, 1]
        status = cluster.status()
        assert status.running
        assert status.pid == first[0]
        assert "workers 0: ALIVE" in status.detail, status.detail
        assert "1: ALIVE" in status.detail, status.detail

        started = time.monotonic()
        cluster.up()
        assert time.monotonic() - started < 5, "a second `up` should only check"
        assert [cluster.master_pid(), *(cluster.worker_pid(i) for i in range(2))] == first

        driver = start_driver(cluster, tmp_path / "driver", drivers, hold=True)
        driver.result()
        executors = cluster.executors()
        assert [i for i, _ in executors] == [0, 1], executors
        processes = {p for pid in first if pid for p in group_members(pid)}
        processes |= {p for _, pid in executors for p in _below(pid)}
        assert {pid for _, pid in executors} <= processes

        cluster.down()
        assert [cluster.master_pid(), *(cluster.worker_pid(i) for i in range(2))] == [None] * 3
        assert [p for p in processes if pid_alive(p)] == []
        taken = [p for p in layout.spark_cluster.all().values() if not port_is_free(p)]
        assert taken == [], f"ports still held after down: {taken}"
        cluster.down()
    finally:
        cluster.reset()


def _below(pid: int) -> set[int]:
    return {pid, *descendants(pid)}


# -- the shared cluster (its fixture: one test at a time) -------------------------------------


@pytest.mark.slow
@pytest.mark.fault_tier  # the default suite's tests/spark/test_cluster.py runs a job on it
def test_a_job_runs_on_both_workers_with_this_interpreter(
    spark_cluster: SparkCluster, tmp_path: Path, drivers: list[Driver]
) -> None:
    driver = start_driver(spark_cluster, tmp_path / "driver", drivers, sleep=1.0)
    application = driver.ready()
    assert application in {a["id"] for a in spark_cluster.active_apps()}
    rows = _by_partition(driver.result()["rows"])
    driver.finish()

    assert sum(r["rows"] for r in rows.values()) == 40
    assert {r["attempt"] for r in rows.values()} == {0}
    assert {r["python"] for r in rows.values()} == {sys.executable}
    executors = {(_worker_of(spark_cluster, r["cwd"]), Path(r["cwd"]).name) for r in rows.values()}
    assert {worker for worker, _ in executors} == {0, 1}, executors
    assert len({executor for _, executor in executors}) == 2, executors
    assert {Path(r["cwd"]).parent.name for r in rows.values()} == {application}
    _wait("the application to end", lambda: not spark_cluster.active_apps(), timeout=30)


@pytest.mark.slow
@pytest.mark.fault_tier  # the default suite's tests/spark/test_cluster.py kills them too
def test_a_killed_executor_is_replaced_and_its_tasks_run_again(
    spark_cluster: SparkCluster, tmp_path: Path, drivers: list[Driver]
) -> None:
    driver = start_driver(spark_cluster, tmp_path / "driver", drivers, sleep=6.0, hold=True)
    driver.ready()
    # Both executors are in a task (each has one core): kill the one running partition 0's.
    running = _wait("two tasks to start", lambda: len(driver.started()) >= 2 and driver.started())
    victim = next(t for t in running if t["attempt"] == 0)
    worker = _worker_of(spark_cluster, victim["cwd"])
    before = spark_cluster.executors()
    assert (worker, victim["executor_pid"]) in before, (victim, before)
    spark_cluster.kill_executor(victim["executor_pid"])
    assert not pid_alive(victim["executor_pid"])

    result = driver.result()
    rows = _by_partition(result["rows"])
    rerun = rows[victim["partition"]]
    assert rerun["attempt"] >= 1, rows
    assert rerun["executor_pid"] != victim["executor_pid"]
    assert sum(r["rows"] for r in rows.values()) == 40
    # The worker started a replacement for the application, which the driver got.
    replaced = _wait(
        "a replacement executor",
        lambda: [
            e
            for e in spark_cluster.executors()
            if e[0] == worker and e[1] != victim["executor_pid"]
        ],
    )
    assert len(spark_cluster.executors()) == 2, (replaced, spark_cluster.executors())
    assert result["executors_after"] == 2
    driver.finish()


@pytest.mark.slow
@pytest.mark.fault_tier  # the default suite's tests/spark/test_cluster.py kills them too
def test_a_killed_worker_comes_back_and_serves_the_application_again(
    spark_cluster: SparkCluster, tmp_path: Path, drivers: list[Driver]
) -> None:
    driver = start_driver(spark_cluster, tmp_path / "driver", drivers, hold=True)
    driver.result()
    executors = spark_cluster.executors()
    assert [i for i, _ in executors] == [0, 1], executors
    lost = executors[1][1]
    old_worker = spark_cluster.worker_pid(1)
    assert old_worker is not None

    spark_cluster.kill_worker(1)
    assert spark_cluster.worker_pid(1) is None
    assert not pid_alive(old_worker)
    assert not pid_alive(lost)
    assert spark_cluster.workers_alive() == [0]
    assert [i for i, _ in spark_cluster.executors()] == [0]

    started = time.monotonic()
    spark_cluster.start_worker(1)
    print(f"worker 1 back in {time.monotonic() - started:.1f} s")
    assert spark_cluster.workers_alive() == [0, 1]
    assert spark_cluster.worker_pid(1) not in (None, old_worker)
    # The application still wants 2 cores: the master gives it an executor there again.
    _wait("an executor on the returned worker", lambda: len(spark_cluster.executors()) == 2)
    assert [i for i, _ in spark_cluster.executors()] == [0, 1]
    driver.finish()
