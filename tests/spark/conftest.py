"""Counts the Spark tests report for the end of a run: how many docs examples ran."""

from __future__ import annotations

from typing import Any, cast

import pytest

from .test_doc_examples import RUN_PROPERTY

_counted: list[dict[str, int]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed:
        _counted.extend(
            cast(dict[str, int], v) for k, v in report.user_properties if k == RUN_PROPERTY
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _counted:
        run = sum(c["run"] for c in _counted)
        skipped = sum(c["typecheck_only"] for c in _counted)
        terminalreporter.write_line(
            f"docs examples: {run} Python blocks of {len(_counted)} pages run against the "
            f"test bed ({skipped} more on those pages marked typecheck-only)"
        )
