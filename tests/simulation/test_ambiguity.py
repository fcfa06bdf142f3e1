"""Exactly once when outcomes are ambiguous: a zombie driver and its successor, in every
schedule, with any state-changing call failing before its server or losing its answer
(world.py says what a case runs and checks, cases.py which cases there are).

The default suite runs `cases.sample` of every shape; `make test-crash` (the crash tier)
runs `cases.exhaustive`, and the run's summary gives the number of cases of each shape by
kind (conftest.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from tests.simulation import cases
from tests.simulation.conftest import CASES_PROPERTY
from tests.simulation.world import SHAPES, Case, Report, Servers, run_case


def _runner(
    servers: Servers, monkeypatch: pytest.MonkeyPatch, failures: list[str]
) -> Callable[[Case], Report]:
    def run(case: Case) -> Report:
        report = run_case(case, servers, monkeypatch)
        if report.problems:
            failures.append(
                f"{case}: {report.problems}\n  A {report.zombie} -> {report.ends['A']}\n"
                f"  B {report.successor} -> {report.ends['B']}\n  calls {report.calls}"
            )
        return report

    return run


def _tally(reports: Iterator[Report]) -> Counter[str]:
    """Cases by kind: `race` (the successor started inside the zombie's epoch) or `no
    race`, then the call that failed and how (`postgres:COMMIT PREPARED lost`), or `no
    fault`."""
    counts: Counter[str] = Counter()
    for report in reports:
        case = report.case
        race = "race" if case.zombie_steps is not None else "no race"
        if case.fault is None:
            fault = "no fault"
        elif report.hit is None:
            fault = "no such call"
        else:
            fault = f"{report.hit} {case.outcome.value}"
        counts[f"{race}, {fault}"] += 1
    return counts


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_sample_of_the_ambiguity_matrix_keeps_every_row_once(
    shape: str, servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures: list[str] = []
    counts = _tally(cases.sample(shape, _runner(servers, monkeypatch, failures)))
    assert sum(n for kind, n in counts.items() if kind.endswith(" lost")) >= 2, counts
    assert counts["race, no fault"] >= 1, counts
    assert not failures, "\n".join(failures)


@pytest.mark.crash_tier
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_case_of_the_ambiguity_matrix_keeps_every_row_once(
    shape: str,
    servers: Servers,
    monkeypatch: pytest.MonkeyPatch,
    record_property: Callable[[str, object], None],
) -> None:
    failures: list[str] = []
    counts = _tally(cases.exhaustive(shape, _runner(servers, monkeypatch, failures)))
    record_property(CASES_PROPERTY, {"shape": shape, "counts": dict(counts)})
    assert not failures, "\n".join(failures[:20])
