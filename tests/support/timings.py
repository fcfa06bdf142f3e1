"""Each test's measured time (setup, call and teardown together), recorded into the JSON file
that `DS_TEST_TIMES` names: the long tiers' runs (tests/long_tiers.py) record them, and
`python -m tests.long_tiers rebalance` balances CI's slices by them.

The file maps node ids (without the `@group` suffix of `--dist loadgroup`) to seconds; a run
adds its tests to what the file already holds, replacing their earlier times.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

#: The variable naming the file; unset, nothing is recorded.
TIMES_ENV = "DS_TEST_TIMES"


def plain_nodeid(nodeid: str) -> str:
    """`nodeid` without the `@<group>` suffix that `--dist loadgroup` gives grouped tests."""
    head, sep, tail = nodeid.rpartition("@")
    return head if sep and "::" in head and re.fullmatch(r"[\w-]+", tail) else nodeid


def read_times(path: Path) -> dict[str, float]:
    """The times a file holds ({} when there is none yet)."""
    if not path.exists():
        return {}
    loaded = json.loads(path.read_text())
    return {str(k): float(v) for k, v in loaded.items()}


class TimesRecorder:
    """A pytest plugin of the controlling process (xdist's workers send it their reports)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = plain_nodeid(report.nodeid)
        self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        if not self.seconds:
            return
        times = read_times(self.path)
        times.update({k: round(v, 2) for k, v in self.seconds.items()})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")
        scratch.replace(self.path)


def register(config: pytest.Config) -> None:
    """Record this session's times if `DS_TEST_TIMES` asks for it (in the controlling
    process only: xdist's workers report to it)."""
    target = os.environ.get(TIMES_ENV)
    if target and not hasattr(config, "workerinput"):
        config.pluginmanager.register(TimesRecorder(Path(target)), "ds-test-times")
