"""Tests of one serial resource run on one pytest-xdist worker (tests/support/xdist_groups.py):
a small suite run with `-n 2 --dist loadgroup`, as `make pytest` runs the real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

CONFTEST = textwrap.dedent(
    """
    import json, os, time
    import pytest
    from tests.support.xdist_groups import add_group_marks, mark_groups

    @pytest.hookimpl(wrapper=True)
    def pytest_collection_modifyitems(config, items):
        add_group_marks(items)
        yield
        mark_groups(config, items)

    @pytest.fixture
    def fault_bed():
        return None

    @pytest.fixture
    def spark_cluster():
        return None

    @pytest.fixture(autouse=True)
    def record(request):
        yield
        time.sleep(0.05)
        with open(os.environ["RAN_LOG"], "a") as log:
            log.write(json.dumps([request.node.name, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
    """
)

TESTS = textwrap.dedent(
    """
    import pytest

    @pytest.mark.parametrize("i", range(6))
    def test_fault(fault_bed, i):
        pass

    @pytest.mark.parametrize("i", range(4))
    def test_cluster(spark_cluster, i):
        pass

    @pytest.mark.parametrize("i", range(12))
    def test_free(i):
        pass
    """
)


def test_each_resource_group_runs_on_one_worker(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_many.py").write_text(TESTS)
    ran = tmp_path / "ran.jsonl"
    env = {**os.environ, "RAN_LOG": str(ran), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-p",
            "no:cacheprovider",
            "-q",
            str(suite),
        ],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    workers: dict[str, set[str]] = defaultdict(set)
    for line in ran.read_text().splitlines():
        name, worker = json.loads(line)
        workers[name.partition("[")[0]].add(worker)
    assert len(workers["test_fault"]) == 1, workers
    assert len(workers["test_cluster"]) == 1, workers
    # The rest spread over both workers, and both groups were not piled onto one behind the
    # other: the largest units are handed out first, one per worker.
    assert workers["test_free"] == {"gw0", "gw1"}, workers
    assert workers["test_fault"] != workers["test_cluster"], workers
