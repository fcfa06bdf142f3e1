"""The compatibility lanes: the Spark tests on the oldest and the newest supported pyspark and
Python (tests/services/compat.py), `make test-compat`.

    python -m tests.compat_lanes [--lane oldest|newest|managed] [--smoke] [-- PYTEST_ARGS]

For each lane: the checkout's wheel replaces the durable-sinks of the lane's virtualenv (built
by `python -m tests.services up compat`; dependencies untouched), then the lane's Python runs
pytest on LANE_TESTS (or SMOKE_TESTS) from the checkout, against the test bed's Postgres,
Kafka and S3 and a Spark Connect server of the lane's own (started from the lane's pyspark
and Python by the tests' fixtures, on ports of its own, stopped afterwards). The Python Data
Source tests run where pyspark has that API (4.x); on 3.5 its ConfigError is tested instead.
Then, without `--smoke`, the managed runtime (tests/services/compat.py, MANAGED): this
Python runs MANAGED_TEST, which installs the wheel into a fresh virtualenv holding the
runtime's pyspark, pandas and numpy and checks that it keeps them.

Prints one line per lane (`== lane oldest (Python 3.10, pyspark 3.5.0): passed in 212 s`) and
for the managed runtime, and exits non-zero if any failed. `make test` runs `--smoke`
(tests/spark/test_compat_lanes.py); `make test-fresh` runs MANAGED_TEST itself.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests.services import Testbed, up
from tests.services._layout import REPO_ROOT
from tests.services.compat import LANES, MANAGED, Lane, install_wheel
from tests.support.tiers import TIERS_ENV
from tests.support.venvs import build_wheel

#: The tests every lane runs (`make test-compat`): driver mode's reads and writes, executor
#: mode, SIGKILLed drivers in both modes, Spark Connect (a killed server too), the data
#: source where pyspark has its API, a batch's numbers beside Spark's query progress, and the
#: install that keeps the lane's pyspark.
LANE_TESTS = (
    "tests/spark/test_driver_reads.py",
    "tests/spark/test_durable_sink.py",
    "tests/spark/test_crash.py",
    "tests/spark/test_connect.py",
    "tests/spark/test_datasource.py",
    "tests/spark/test_progress.py",
    "tests/unit/test_install_keeps_spark.py",
)
#: What `make test` runs of each lane (tests/spark/test_compat_lanes.py): both reads and a
#: writer in driver mode, an executor-mode writer (the lane's workers start Python with the
#: package and prepare in their tasks), the data source or its refusal, the install. The
#: SIGKILLed drivers of both modes are in the whole set; `make test` runs them on the
#: project's pyspark.
SMOKE_TESTS = (
    "tests/spark/test_driver_reads.py",
    "tests/spark/test_durable_sink.py::"
    "test_executor_mode_prepares_each_partition_in_its_task_and_commits_them_atomically",
    "tests/spark/test_datasource.py::test_format_durable_works_or_names_the_pyspark_it_needs",
    "tests/unit/test_install_keeps_spark.py",
)
#: The managed runtime's test (`compat_tier`: the default suite deselects it).
MANAGED_TEST = "tests/unit/test_install_keeps_pandas.py"
#: Where each lane's Spark Connect servers listen: the main bed's ports plus this, times the
#: lane's position (1, 2, ...).
CONNECT_PORT_STEP = 10
LANE_TIMEOUT = 3600.0


def lane_environment(testbed: Testbed, index: int, chosen: Lane, wheel: Path) -> dict[str, str]:
    """The lane's pytest environment: its own Connect servers' ports and folder, the wheel."""
    layout = testbed.layout
    shift = CONNECT_PORT_STEP * (index + 1)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "VIRTUAL_ENV")}
    env.update(
        DS_CONNECT_PORT=str(layout.connect.port + shift),
        DS_FAULTS_CONNECT_PORT=str(layout.connect.killable + shift),
        DS_CONNECT_DIR=str(layout.root / "compat" / chosen.name),
        DS_COMPAT_LANE=chosen.name,
        DS_COMPAT_WHEEL=str(wheel),
        # Every Spark kill of the lane's files, also those the default suite leaves to the
        # crash and fault tiers (one kill per mode is the default suite's).
        **{TIERS_ENV: "fault_tier,crash_tier"},
    )
    return env


def run_lane(
    testbed: Testbed,
    index: int,
    chosen: Lane,
    wheel: Path,
    tests: Sequence[str],
    pytest_args: Sequence[str],
) -> bool:
    python = testbed.compat.python(chosen)
    install_wheel(python, wheel)
    env = lane_environment(testbed, index, chosen, wheel)
    started = time.monotonic()
    print(f"== lane {chosen.name} ({chosen.describe()}): {python}", flush=True)
    try:
        done = subprocess.run(
            [
                str(python),
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-n",
                "2",
                "--dist",
                "loadgroup",
                *tests,
                *(arg for test in chosen.lacks for arg in ("--deselect", test)),
                *pytest_args,
            ],
            cwd=REPO_ROOT,
            env=env,
            timeout=LANE_TIMEOUT,
            check=False,
        )
        passed = done.returncode == 0
    finally:
        subprocess.run(
            [str(python), "-m", "tests.services", "down", "connect", "faults-connect"],
            cwd=REPO_ROOT,
            env=env,
            check=False,
            capture_output=True,
        )
    verdict = "passed" if passed else "FAILED"
    print(
        f"== lane {chosen.name} ({chosen.describe()}): {verdict} in "
        f"{time.monotonic() - started:.0f} s",
        flush=True,
    )
    return passed


def run_managed(wheel: Path) -> bool:
    """MANAGED_TEST with this Python, on `wheel` (the arguments for the lanes' pytest, such as
    `-k`, are not passed on)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "VIRTUAL_ENV")}
    env.update(DS_COMPAT_WHEEL=str(wheel), **{TIERS_ENV: "compat_tier"})
    what = f"== {MANAGED.name} runtime ({MANAGED.describe()})"
    started = time.monotonic()
    print(f"{what}: {MANAGED_TEST}", flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", MANAGED_TEST],
        cwd=REPO_ROOT,
        env=env,
        timeout=LANE_TIMEOUT,
        check=False,
    )
    verdict = "passed" if done.returncode == 0 else "FAILED"
    print(f"{what}: {verdict} in {time.monotonic() - started:.0f} s", flush=True)
    return done.returncode == 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat_lanes", description=__doc__)
    parser.add_argument("--lane", choices=[*(c.name for c in LANES), MANAGED.name], action="append")
    parser.add_argument("--smoke", action="store_true", help="SMOKE_TESTS instead of LANE_TESTS")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    args = parser.parse_args(argv)
    chosen = [c for c in LANES if not args.lane or c.name in args.lane]
    managed = not args.smoke and (not args.lane or MANAGED.name in args.lane)
    testbed = Testbed.create()
    if chosen:
        up(["postgres", "kafka", "s3", "compat"], testbed)
    tests = SMOKE_TESTS if args.smoke else LANE_TESTS
    with tempfile.TemporaryDirectory(prefix="ds-compat-") as scratch:
        wheel = build_wheel(Path(scratch) / "clone", Path(scratch) / "dist")
        results = [
            run_lane(testbed, LANES.index(c), c, wheel, tests, args.pytest_args) for c in chosen
        ]
        if managed:
            results.append(run_managed(wheel))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
