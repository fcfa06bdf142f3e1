"""Executor mode on a real Spark standalone cluster (a master and two workers, each executor a
JVM of its own): an executor or a whole worker lost mid-batch, after its task prepared its
part in every sink. Spark reruns the task elsewhere; the driver's decision names the rerun's
parts only, and the dead attempt's prepared work (a Postgres transaction, an S3 multipart
upload, a staged folder) is rolled back, never committed.

The driver runs in a child process (tests/spark/cluster_child.py); the first attempt of
partition 0 of the paused batch stops after preparing and says so in a flag file, and the test
then kills the executor it runs on, or its worker (lost for good, or back a little later).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durable_sinks.sinks.folder import STAGING
from tests.services import PostgresEndpoint, S3Endpoint
from tests.services._process import descendants
from tests.services.spark_cluster import SparkCluster
from tests.support.child_process import start_child
from tests.support.s3_objects import incomplete_uploads
from tests.support.s3_target import s3_options

from .streams import (
    postgres_ids,
    prepared_transactions,
    published_file_ids,
    s3_committed_ids,
    write_input,
)

ROOT = Path(__file__).resolve().parents[2]
FILES, ROWS_PER_FILE, PARTITIONS, PAUSED_EPOCH = 3, 30, 4, 1
SINKS = ("postgres", "s3", "files")


@dataclass
class ClusterJob:
    """One test's job on the cluster: `run(lose, after)` (see run_losing_an_executor)."""

    cluster: SparkCluster
    postgres: PostgresEndpoint
    s3: S3Endpoint
    s3_prefix: str
    pg_schema: str
    job_id: str
    folder: Path

    @property
    def dsn(self) -> str:
        return self.postgres.conninfo()

    @property
    def s3_path(self) -> str:
        return f"s3://{self.s3.bucket}/{self.s3_prefix.rstrip('/')}"

    def run(
        self, lose: Callable[[int, int], None], after: Callable[[Path], None] | None = None
    ) -> None:
        run_losing_an_executor(self, lose, after)

    def plan(self, **extra: Any) -> dict[str, Any]:
        """The driver's plan (tests/spark/cluster_child.py) over FILES input files, written
        once, with `extra` added."""
        source = self.folder / "in"
        if not source.exists():
            for n in range(FILES):
                ids = range(n * ROWS_PER_FILE, (n + 1) * ROWS_PER_FILE)
                write_input(source, f"part-{n:04d}.json", ids)
        return {
            "conf": self.cluster.driver_conf(),
            "env": self.cluster.driver_env(),
            "dsn": self.dsn,
            "table": f"{self.pg_schema}.events",
            "s3": s3_options(self.s3, self.s3_path),
            "files": str(self.folder / "out"),
            "job_id": self.job_id,
            "source": str(source),
            "checkpoint": str(self.folder / "checkpoint"),
            "partitions": PARTITIONS,
            **extra,
        }

    def audit(self) -> None:
        """Every sink holds every input row once; nothing is left prepared, incomplete or
        staged."""
        expected = list(range(FILES * ROWS_PER_FILE))
        assert postgres_ids(self.dsn, f"{self.pg_schema}.events") == expected
        assert s3_committed_ids(self.s3, self.s3_path) == expected
        assert published_file_ids(self.folder / "out") == expected
        assert prepared_transactions(self.dsn, self.job_id) == []
        assert incomplete_uploads(self.s3.client(), self.s3.bucket, self.s3_prefix) == []
        assert sorted((self.folder / "out" / STAGING).iterdir()) == []


def executor_of(cluster: SparkCluster, python_pid: int) -> tuple[int, int]:
    """(worker index, executor pid) of the executor JVM whose Python worker is `python_pid`."""
    for worker, pid in cluster.executors():
        if python_pid in descendants(pid):
            return worker, pid
    raise AssertionError(f"no executor of the cluster runs Python worker {python_pid}")


def run_losing_an_executor(
    job: ClusterJob,
    lose: Callable[[int, int], None],
    after: Callable[[Path], None] | None = None,
) -> None:
    """Run the job on the cluster, call `lose(worker, executor_pid)` while the paused task
    holds its prepared parts, let the query finish, and check every sink holds every row
    once and nothing is left in doubt. `after(flags)`, if given, runs once `lose` returned,
    with the next batch held until it creates `release-<n>` (cluster_child.py)."""
    flags = job.folder / "flags"
    flags.mkdir()
    plan = job.plan(pause={"epoch": PAUSED_EPOCH, "flags": str(flags)})
    if after is not None:
        plan["hold"] = {"epoch": PAUSED_EPOCH + 1, "flags": str(flags)}
    flag = flags / f"paused-{PAUSED_EPOCH}.json"
    driver, log = start_child("tests.spark.cluster_child", plan, job.folder, "driver")
    try:
        deadline = time.monotonic() + 240
        while not flag.exists() or not flag.read_text():
            assert driver.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "no task reached the pause"
            time.sleep(0.2)
        paused = json.loads(flag.read_text())
        # The paused attempt's parts are prepared: a Postgres transaction named after it.
        in_doubt = prepared_transactions(job.postgres.conninfo(), job.job_id)
        assert any(f":{paused['part']}:" in gid for gid in in_doubt), (paused, in_doubt)
        worker, executor = executor_of(job.cluster, paused["pid"])
        lose(worker, executor)
        if after is not None:
            after(flags)
        code = driver.wait(timeout=400)
    finally:
        stop(driver)
    report = finished(code, log)
    job.audit()
    # The paused batch was decided on the rerun's parts: one per partition and sink, none of
    # them the lost attempt's.
    decided = {b["epoch"]: b for b in report["batches"]}[PAUSED_EPOCH]
    assert decided["outcome"] == "committed"
    assert len(decided["participants"]) == PARTITIONS * len(SINKS)
    assert not any(f":{paused['part']}:" in p for p in decided["participants"])


def stop(driver: subprocess.Popen[bytes]) -> None:
    if driver.poll() is None:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()


def finished(code: int, log: Path) -> dict[str, Any]:
    """The report of a driver that ran its query to the end (exit `code`, output in `log`)."""
    output = log.read_text(errors="replace")
    assert code == 0, output[-4000:]
    report: dict[str, Any] = json.loads(
        [line for line in output.splitlines() if line.startswith('{"error"')][-1]
    )
    assert report["error"] is None, report["error"]
    return report


@pytest.fixture
def cluster_job(
    spark_cluster: SparkCluster,
    postgres: PostgresEndpoint,
    s3: S3Endpoint,
    s3_prefix: str,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
) -> ClusterJob:
    return ClusterJob(spark_cluster, postgres, s3, s3_prefix, pg_schema, job_id, tmp_path)


@pytest.mark.timeout(900)
def test_an_executor_lost_mid_batch_leaves_nothing_but_the_rerun(cluster_job: ClusterJob) -> None:
    def lose(worker: int, executor: int) -> None:
        cluster_job.cluster.kill_executor(executor)

    cluster_job.run(lose)


@pytest.mark.fault_tier  # the fault tier's; the executor lost above is the default suite's
@pytest.mark.timeout(900)
def test_a_worker_lost_for_good_mid_batch_the_job_finishes_on_the_other(
    cluster_job: ClusterJob,
) -> None:
    cluster = cluster_job.cluster

    def lose(worker: int, executor: int) -> None:
        cluster.kill_worker(worker)
        assert len(cluster.workers_alive()) == 1

    cluster_job.run(lose)
    assert len(cluster.workers_alive()) == 1  # no worker came back: one did all the rest


@pytest.mark.fault_tier  # the fault tier's; the executor lost above is the default suite's
@pytest.mark.timeout(900)
def test_a_worker_lost_mid_batch_then_back_runs_executors_again(cluster_job: ClusterJob) -> None:
    cluster = cluster_job.cluster
    lost: list[int] = []
    back: list[tuple[int, int]] = []

    def lose(worker: int, executor: int) -> None:
        cluster.kill_worker(worker)
        lost.append(worker)
        cluster.start_worker(worker)

    def after(flags: Path) -> None:
        # The next batch is held (the application up, none of its tasks scheduled) until the
        # master has given the application an executor on the returned worker.
        held = flags / f"held-{PAUSED_EPOCH + 1}"
        deadline = time.monotonic() + 240
        while not held.exists():
            assert time.monotonic() < deadline, "the batch after the loss never started"
            time.sleep(0.2)
        while not (on := [e for e in cluster.executors() if e[0] == lost[0]]):
            assert time.monotonic() < deadline, "the returned worker got no executor"
            time.sleep(0.5)
        back.extend(on)
        (flags / f"release-{PAUSED_EPOCH + 1}").touch()

    cluster_job.run(lose, after)
    assert len(back) == 1  # one executor of the application on the returned worker
    assert cluster.workers_alive() == [0, 1]


@pytest.mark.fault_tier  # two driver runs on the cluster
@pytest.mark.timeout(900)
@pytest.mark.parametrize("sink", ["postgres", "s3"])
def test_a_driver_killed_amid_its_background_concurrent_commits_is_finished_by_its_restart(
    cluster_job: ClusterJob, sink: str
) -> None:
    """Background and concurrent commits on the cluster: the driver (its Python process and
    its JVM) is SIGKILLed once 2 of a sink's PARTITIONS commits of epoch 1 returned, while
    Spark may already run epoch 2's tasks. The restarted query's recovery commits the rest
    of epoch 1 and the query goes on; every row lands once in every sink."""
    folder = cluster_job.folder
    kill = {"epoch": 1, "sink": sink, "after": 2}
    plan = cluster_job.plan(background=True, die_in_commits=kill)
    driver, log = start_child("tests.spark.cluster_child", plan, folder, "killed")
    try:
        code = driver.wait(timeout=400)
    finally:
        stop(driver)
    output = log.read_text(errors="replace")
    assert code == -signal.SIGKILL, output[-4000:]
    assert f"killing after 2 {sink} commits of epoch 1" in output
    # Epoch 1 is decided but not all of it is committed (the sinks after the killed one
    # not at all).
    unfinished = [
        *prepared_transactions(cluster_job.dsn, cluster_job.job_id),
        *incomplete_uploads(cluster_job.s3.client(), cluster_job.s3.bucket, cluster_job.s3_prefix),
        *(folder / "out" / STAGING).iterdir(),
    ]
    assert unfinished
    driver, log = start_child(
        "tests.spark.cluster_child", cluster_job.plan(background=True), folder, "restarted"
    )
    try:
        code = driver.wait(timeout=400)
    finally:
        stop(driver)
    finished(code, log)
    cluster_job.audit()
