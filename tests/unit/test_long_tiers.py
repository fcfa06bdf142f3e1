"""CI's rotation through the long tiers (tests/long_tiers.py): how tests are dealt into slices,
how a run's times are recorded, and which marks a run includes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import long_tiers
from tests.long_tiers import SLICES, Slices, Unit, next_slice, rebalance
from tests.services._layout import REPO_ROOT
from tests.support.tiers import TIER_MARKS, TIERS_ENV, tier_included
from tests.support.timings import TIMES_ENV, plain_nodeid, read_times


def units(count: int, tier: str = "faults") -> list[Unit]:
    return [Unit(tier, f"tests/faults/test_x.py::test_{n}") for n in range(count)]


def test_rebalance_deals_the_longest_first_to_the_emptiest_slice() -> None:
    made = units(11)
    measured = [100, 90, 80, 70, 60, 10, 10, 10, 10, 10, 10]
    times = {u.key: float(s) for u, s in zip(made, measured, strict=True)}
    assigned = rebalance(made, times)
    loads = [0.0] * SLICES
    for slice_, share in assigned.values():
        loads[slice_] += share
    assert SLICES == 10
    assert sorted(loads) == [10.0, 10.0, 10.0, 10.0, 20.0, 60.0, 70.0, 80.0, 90.0, 100.0]
    assert {k for k, (s, _) in assigned.items() if s == assigned[made[0].key][0]} == {made[0].key}


def test_an_unmeasured_test_counts_as_its_tiers_median() -> None:
    made = units(4)
    times = {made[0].key: 10.0, made[1].key: 20.0, made[2].key: 30.0}
    assert rebalance(made, times)[made[3].key][1] == 20.0
    lone = [Unit("compat", "oldest")]
    assert rebalance(lone, {})[lone[0].key][1] == 60.0


def test_a_test_of_a_tier_on_two_workers_counts_half_its_time() -> None:
    crash = Unit("crash", "tests/crash/test_x.py::test_y")
    assert rebalance([crash], {crash.key: 100.0})[crash.key][1] == 50.0


def test_a_test_not_dealt_yet_goes_to_the_slice_its_name_hashes_to() -> None:
    made = units(40)
    slices = Slices({made[0].key: (3, 12.0)})
    assert slices.slice_of(made[0]) == 3
    assert slices.seconds_of(made[0]) == 12.0
    others = [slices.slice_of(u) for u in made[1:]]
    assert others == [slices.slice_of(u) for u in made[1:]]  # stable
    assert set(others) == set(range(SLICES))  # and spread
    assert slices.seconds_of(made[1]) is None
    dealt = slices.deal(made)
    assert sorted(u.key for k in dealt for u in dealt[k]) == sorted(u.key for u in made)


def test_every_recorded_unit_names_a_slice_of_the_rotation() -> None:
    data = json.loads(long_tiers.SLICES_FILE.read_text())
    assert data["slices"] == SLICES
    assert data["units"], "tests/slices.json deals no test"
    tiers = {key.split("::", 1)[0] for key in data["units"]}
    assert tiers == set(long_tiers.TIER_NAMES)
    assert all(0 <= slice_ < SLICES and seconds >= 0 for slice_, seconds in data["units"].values())


def test_ci_takes_the_slice_it_ran_least_recently() -> None:
    assert next_slice([], landing=662) == 2  # a new machine: from the landing's number on
    assert next_slice([{"slice": 2}], landing=663) == 3
    assert next_slice([{"slice": 2}, {"slice": 3}], landing=663) == 4
    # Several commits landed at once, a CI run repeated: the rotation goes on regardless.
    runs = [{"slice": k} for k in (2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 3)]
    assert next_slice(runs, landing=700) == 5
    # Slices that never ran come first, from the landing's number on.
    assert next_slice([{"slice": k} for k in (2, 3, 4, 0, 1)], landing=700) == 5
    assert next_slice([{"slice": k} for k in (0, 1, 3)], landing=0) == 2


def test_any_slices_many_consecutive_ci_runs_run_every_slice() -> None:
    runs: list[dict[str, object]] = []
    for landing in (5, 9, 9, 12, 40, 41, 43, 100, 101, 103, 170, 171):
        runs.append({"slice": next_slice(runs, landing)})
    taken = [run["slice"] for run in runs]
    for start in range(len(taken) - SLICES + 1):
        assert set(taken[start : start + SLICES]) == set(range(SLICES)), taken


def test_ci_records_each_run_in_the_test_beds_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DS_CACHE_DIR", str(tmp_path))
    assert long_tiers.ci_runs() == []
    for k in range(long_tiers.CI_RECORD_RUNS + 3):
        long_tiers.record_ci_run(k % SLICES, passed=k != 1)
    runs = long_tiers.ci_runs()
    assert len(runs) == long_tiers.CI_RECORD_RUNS
    assert runs[-1]["slice"] == (long_tiers.CI_RECORD_RUNS + 2) % SLICES
    assert runs[-1]["commit"] == long_tiers.head()
    assert (tmp_path / long_tiers.CI_RECORD).exists()


def test_group_suffixes_are_dropped_from_node_ids() -> None:
    assert plain_nodeid("tests/a.py::test_b[x-y]@faults") == "tests/a.py::test_b[x-y]"
    assert plain_nodeid("tests/a.py::test_b@faults-connect") == "tests/a.py::test_b"
    assert plain_nodeid("tests/a.py::test_b[user@host]") == "tests/a.py::test_b[user@host]"
    assert plain_nodeid("tests/a.py::test_b") == "tests/a.py::test_b"


def test_a_run_records_each_tests_time_on_two_workers(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(
        "from tests.support.timings import register\n"
        "def pytest_configure(config):\n"
        "    register(config)\n"
    )
    (suite / "test_timed.py").write_text(
        "import time\ndef test_slow():\n    time.sleep(0.3)\ndef test_quick():\n    pass\n"
    )
    times = tmp_path / "times.json"
    times.write_text(json.dumps({"earlier.py::test_kept": 5.0}))
    env = {**os.environ, TIMES_ENV: str(times), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", str(suite)],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = read_times(times)
    assert recorded["earlier.py::test_kept"] == 5.0
    assert recorded["test_timed.py::test_slow"] >= 0.3
    assert recorded["test_timed.py::test_quick"] < 0.3
    assert len(recorded) == 3, recorded


@pytest.mark.parametrize("mark", sorted(TIER_MARKS))
def test_a_tiers_marked_tests_run_where_its_variable_or_ds_tiers_says(
    mark: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in (*TIER_MARKS.values(), TIERS_ENV):
        monkeypatch.delenv(variable, raising=False)
    assert not tier_included(mark)
    monkeypatch.setenv(TIER_MARKS[mark], "1")
    assert tier_included(mark)
    monkeypatch.delenv(TIER_MARKS[mark])
    monkeypatch.setenv(TIERS_ENV, f"other_tier, {mark}")
    assert tier_included(mark)
