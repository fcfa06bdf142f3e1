"""Counts the unit tests report for the end of a run: how many docs examples were checked."""

from __future__ import annotations

from typing import Any, cast

import pytest

from .test_doc_examples import EXAMPLES_PROPERTY

_counted: list[dict[str, int]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _counted.extend(
            cast(dict[str, int], v) for k, v in report.user_properties if k == EXAMPLES_PROPERTY
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for found in _counted:
        terminalreporter.write_line(
            f"docs examples: {found['blocks']} Python blocks of {found['pages']} pages "
            f"type-checked with mypy --strict ({found['typecheck_only']} of them marked "
            "typecheck-only; the others run against the test bed in tests/spark)"
        )
