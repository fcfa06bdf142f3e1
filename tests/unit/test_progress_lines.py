"""The progress lines of the long commands: the conformance suite's (the extended crash run),
`make bench`'s runner and the soak's."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.run_all import STEPS, clock, main, progress
from durable_sinks.testing._progress import PROGRESS_ENV, ExampleProgress, progress_line
from tests.soak.progress import Snapshot
from tests.soak.progress import progress_line as soak_line


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_conformance_line_has_the_count_the_time_so_far_and_an_estimate_of_the_rest() -> None:
    assert progress_line("test_x", 400, 2000, 360.0) == (
        "test_x: 400/2000 examples (20%), 6.0 min so far, ~24.0 min left"
    )
    assert progress_line("test_x", 2000, 2000, 1800.0) == (
        "test_x: 2000/2000 examples (100%), 30.0 min so far"
    )
    assert "left" not in progress_line("test_x", 0, 2000, 1.0)
    assert progress_line("test_x", 10, 20, 60.0, discarded=7) == (
        "test_x: 10/20 examples (50%; 7 more discarded), 1.0 min so far, ~1.0 min left"
    )


def test_a_line_every_twentieth_of_the_run_and_at_least_once_a_minute() -> None:
    lines: list[str] = []
    now = FakeClock()
    run = ExampleProgress("test_x", 200, lines.append, now=now)
    assert run.every == 10
    for _ in range(25):
        now.now += 1.0
        run.example_done()
    assert [line.split(":")[1].split(",")[0] for line in lines] == [
        " 10/200 examples (5%)",
        " 20/200 examples (10%)",
    ]
    now.now += 61.0  # one slow example: a line although 26 is no multiple of 10
    run.example_done()
    assert lines[-1].startswith("test_x: 26/200 examples (13%), 1.4 min so far")
    run.example_done(counted=False)  # discarded by hypothesis: not one of the 200
    assert (run.done, run.discarded, len(lines)) == (26, 1, 3)
    run.finished("passed")
    assert lines[-1] == "test_x: passed after 26 examples (1 more discarded), 1.4 min"


def test_the_lines_go_where_the_environment_says_labelled_by_the_running_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    assert ExampleProgress.from_environment(10, "scenario") is None
    log = tmp_path / "progress.log"
    monkeypatch.setenv(PROGRESS_ENV, str(log))
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/integration/test_pg.py::test_alone (call)")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    run = ExampleProgress.from_environment(10, "scenario")
    assert run is not None
    run.example_done()
    run.finished("failed")
    first, last = log.read_text().splitlines()
    assert first.endswith(
        "[gw1] test_pg.py::test_alone: 1/10 examples (10%), 0.0 min so far, ~0.0 min left"
    )
    assert last.endswith(
        "[gw1] test_pg.py::test_alone: failed after 1 examples (0 more discarded), 0.0 min"
    )


def test_the_benchmark_runner_says_which_of_how_many_and_since_when(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert [clock(s) for s in (42, 75, 3725)] == ["42s", "1m15s", "1h02m05s"]
    assert progress(3, 9, "kafka_sink", "done in 1m20s", 725.0) == (
        "[3/9] kafka_sink: done in 1m20s (12m05s since the start)"
    )
    assert main(["--list", "--quick", "--only", "protocol_overhead,s3_sink"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "python -m benchmarks.protocol_overhead --chart docs/img/protocol_overhead.png",
        "python -m benchmarks.s3_sink --only s3 --profile 0 --chart docs/img/s3_sink.png",
    ]
    assert len({step.name for step in STEPS}) == len(STEPS)  # one chart file each


def test_the_soak_line_has_minutes_rows_faults_and_restarts() -> None:
    line = soak_line(
        Snapshot(elapsed=720, total=1800, fed=7200, landed=6950, faults=35, missed=3, starts=13)
    )
    assert line == (
        "progress: 12.0 of 30 min, 18.0 left; 7,200 rows fed, 6,950 in Postgres; 35 faults "
        "injected (3 found nothing to act on); 13 driver starts (12 restarts)"
    )
    down = Snapshot(
        elapsed=30, total=300, fed=25, landed="? (OperationalError)", faults=0, missed=0, starts=1
    )
    assert soak_line(down) == (
        "progress: 0.5 of 5 min, 4.5 left; 25 rows fed, ? (OperationalError) in Postgres; "
        "0 faults injected; 1 driver starts (0 restarts)"
    )
