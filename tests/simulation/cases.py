"""The cases of the simulation, enumerated (never sampled at random) from what the job does.

For a job shape, a case is a schedule of the zombie A and its successor B (world.Case) and,
optionally, one failed call. The enumeration learns the steps and calls by running:

- schedules: A's whole epoch then B (no race); for every step i of A's epoch, B starting
  after it and running to its end before A resumes; and, for every step j of B's run short
  of its end, B stopping there while A resumes and finishes (a zombie that wakes in the
  middle of its successor's recovery or replay). Every point where one driver can stop and
  the other run, once each way;
- faults: for the no-race schedule and every "A stops after step i, B runs whole" schedule,
  every state-changing call the two make (Postgres, Kafka, S3 and local-folder calls:
  faults.py), failed before reaching its server and with its answer lost after it took
  effect.

`exhaustive` gives every case; `sample` a fixed subset for the default suite: the no-race
schedule, the race at A's decision point, and the first call of each kind (each client
operation) of the no-race schedule with its answer lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from tests.simulation.faults import Outcome
from tests.simulation.world import Case, Report

Run = Callable[[Case], Report]


def _schedules(shape: str, run: Run) -> Iterator[Report]:
    """Every schedule of `shape`, each run once without a fault (module docstring)."""
    whole = run(Case(shape))
    yield whole
    for i in range(len(whole.zombie)):
        b_whole = run(Case(shape, i, None))
        yield b_whole
        for j in range(1, b_whole.successor_length):
            yield run(Case(shape, i, j))


def _faults(report: Report, run: Run) -> Iterator[Report]:
    for call in range(1, len(report.calls) + 1):
        for outcome in Outcome:
            yield run(replace(report.case, fault=call, outcome=outcome))


def exhaustive(shape: str, run: Run) -> Iterator[Report]:
    """Every case of `shape`: every schedule, and every fault under the schedules whose B runs
    whole."""
    for report in _schedules(shape, run):
        yield report
        if report.case.successor_steps is None:
            yield from _faults(report, run)


def sample(shape: str, run: Run) -> Iterator[Report]:
    """The default suite's subset: the no-race schedule; the first call of each kind in it
    (each client operation) with its answer lost; B taking over right after A's decision."""
    whole = run(Case(shape))
    yield whole
    firsts = {name: index for index, name in reversed(list(enumerate(whole.calls, 1)))}
    for call in sorted(firsts.values()):
        yield run(replace(whole.case, fault=call, outcome=Outcome.LOST))
    decided = [i for i, step in enumerate(whole.zombie) if step == "after-decision"]
    for i in decided:
        yield run(Case(shape, i + 1, None))
