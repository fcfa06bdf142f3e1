"""Real processes killed with SIGKILL: at each named crash point, and at random moments (inside
Parquet writes, fsyncs and renames). A fresh process recovers and finishes; every sink then
holds every epoch's rows exactly once and nothing prepared is left behind."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from durable_sinks.sinks.folder import STAGING
from tests.crash.sigkill_child import SINKS, expected_rows
from tests.services._layout import REPO_ROOT
from tests.support.targets import FileTarget
from tests.support.tiers import SIGKILL_RUNS

EPOCHS = 5
CRASH_EPOCH = 2
RANDOM_KILLS = SIGKILL_RUNS


def child(root: Path, epochs: int, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.crash.sigkill_child",
            str(root),
            "--epochs",
            str(epochs),
            *extra,
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def finish(proc: subprocess.Popen[bytes], timeout: float = 120) -> tuple[int, str]:
    output, _ = proc.communicate(timeout=timeout)
    return proc.returncode, output.decode(errors="replace")


def assert_exactly_once(root: Path, epochs: int, rows: int = 200) -> None:
    expected = Counter(expected_rows(epochs, rows))
    for name in SINKS:
        target = FileTarget(root / name, name)
        seen = Counter(target.committed_rows())
        assert not [r for r, n in seen.items() if n > 1], f"sink {name}: duplicates"
        assert seen == expected, (
            f"sink {name}: {sum((expected - seen).values())} rows missing, "
            f"{sum((seen - expected).values())} unexpected"
        )
        assert not (root / name / STAGING).exists() or not any((root / name / STAGING).iterdir())
    assert sorted(int(p.name) for p in (root / "commits").iterdir()) == list(range(epochs))


CRASH_POINTS = [
    "epoch-start",
    "after-begin:a",
    "after-write:0:a",
    "after-write:2:b",
    "after-pre-commit:a",
    "after-pre-commit:b",
    "after-decision",
    "after-commit:a",  # between the two sinks' commits
    "after-commit:b",
    "after-finish",
    "after-run",  # fn returned, Spark's commit log not yet written
]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_sigkill_at_named_point_then_recover(tmp_path: Path, point: str) -> None:
    code, output = finish(
        child(tmp_path, EPOCHS, "--crash-at", point, "--crash-epoch", str(CRASH_EPOCH))
    )
    assert code == -signal.SIGKILL, f"the child was meant to die at {point}:\n{output}"
    code, output = finish(child(tmp_path, EPOCHS))
    assert code == 0, output
    assert_exactly_once(tmp_path, EPOCHS)


@pytest.mark.parametrize("point", ["after-decision", "after-run"])
def test_sigkill_with_phase_2_in_the_background_then_recover(tmp_path: Path, point: str) -> None:
    """background_commits: killed at the decision, or once the batch returned while its
    commits may still run (or have not begun) in the background."""
    extra = ("--background-commits", "--crash-at", point, "--crash-epoch", str(CRASH_EPOCH))
    code, output = finish(child(tmp_path, EPOCHS, *extra))
    assert code == -signal.SIGKILL, f"the child was meant to die at {point}:\n{output}"
    code, output = finish(child(tmp_path, EPOCHS, "--background-commits"))
    assert code == 0, output
    assert_exactly_once(tmp_path, EPOCHS)


@pytest.mark.parametrize(
    "recovery_point", ["recovery:after-fence", "recovery:after-open:b", "recovery:after-resolve"]
)
def test_sigkill_during_recovery(tmp_path: Path, recovery_point: str) -> None:
    """Leave prepared participants (crash after both pre-commits), crash again while the next
    process resolves them, then let a third process finish."""
    code, _ = finish(
        child(tmp_path, EPOCHS, "--crash-at", "after-pre-commit:b", "--crash-epoch", "2")
    )
    assert code == -signal.SIGKILL
    code, output = finish(child(tmp_path, EPOCHS, "--crash-at", recovery_point))
    assert code == -signal.SIGKILL, f"expected to die at {recovery_point}:\n{output}"
    code, output = finish(child(tmp_path, EPOCHS))
    assert code == 0, output
    assert_exactly_once(tmp_path, EPOCHS)


@pytest.mark.parametrize(
    "background",
    [False, pytest.param(True, marks=pytest.mark.crash_tier)],
    ids=["inline", "background-commits"],
)
def test_sigkill_at_random_moments(tmp_path: Path, background: bool) -> None:
    """Kill the job from outside at random times, RANDOM_KILLS times (DS_SIGKILL_RUNS), then
    let it finish. Small epochs, so kills land in every phase, inside sink calls too (with
    background_commits, inside a commit in the background as well)."""
    mode = ("--background-commits",) if background else ()
    seed = int(os.environ.get("DS_SIGKILL_SEED") or time.time())
    rng = random.Random(seed)
    epochs, rows = 150 * RANDOM_KILLS, 10
    kills = 0
    for _ in range(RANDOM_KILLS):
        proc = child(tmp_path, epochs, "--rows", str(rows), *mode)
        time.sleep(rng.uniform(0.4, 1.2))  # start-up ~0.5 s, then ~100 epochs/s
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        code, output = finish(proc)
        assert code in (0, -signal.SIGKILL), f"seed {seed}:\n{output}"
    code, output = finish(child(tmp_path, epochs, "--rows", str(rows), *mode), timeout=600)
    assert code == 0, f"seed {seed}:\n{output}"
    assert kills == RANDOM_KILLS, f"seed {seed}: only {kills} of {RANDOM_KILLS} runs were killed"
    assert_exactly_once(tmp_path, epochs, rows)
