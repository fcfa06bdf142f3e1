"""The conformance suite against the file sink: alone, two at once (a crash can fall between
their commits), with the journal last resource (Kafka's commit semantics), and refusing rows
into a files dead-letter sink (on_bad_rows="dead_letter")."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.testing import (
    DEAD_LETTER_COLUMNS,
    EPOCH_STEP_KINDS,
    RECOVERY_STEP_KINDS,
    ConformanceStats,
    Scenario,
    Target,
    run_conformance,
)
from tests.support.refusing_sink import CONFORMANCE_BAD_ROWS, RefusingConformanceFileSink
from tests.support.targets import FileTarget, JournalTarget
from tests.support.tiers import (
    CONFORMANCE_EXAMPLES,
    CONFORMANCE_SAMPLE,
    DEAD_LETTER_EXAMPLES,
    DEAD_LETTER_SAMPLE,
)


def scenario_of(
    *make_targets: Callable[[Path], Target], dead_letter: Callable[[Path], Target] | None = None
) -> Callable[[], Scenario]:
    def make() -> Scenario:
        folder = Path(tempfile.mkdtemp(prefix="ds-conformance-"))
        targets: Sequence[Target] = [make(folder) for make in make_targets]
        return Scenario(
            job_id="conformance",
            targets=targets,
            store=lambda: LocalDirectoryStore(folder / "store"),
            cleanup=lambda: shutil.rmtree(folder, ignore_errors=True),
            dead_letter=None if dead_letter is None else dead_letter(folder),
        )

    return make


def files_dead_letter(folder: Path) -> Target:
    return FileTarget(folder / "dead", "dead_letters", columns=DEAD_LETTER_COLUMNS)


# Crashes while resolving leftovers need a crash that left some, then a restart crashing at
# that step: too rare to demand of every random run; test_sigkill.py covers it every time.
EVERY_STEP_KIND = set(EPOCH_STEP_KINDS) | set(RECOVERY_STEP_KINDS) - {"recovery:after-resolve"}


def check_exercised(
    stats: ConformanceStats,
    without: frozenset[str] = frozenset(),
    examples: int = CONFORMANCE_EXAMPLES,
) -> None:
    """The run really explored: its generated examples (CONFORMANCE_EXAMPLES of this tier)
    besides the scripted sweep, crashes at every kind of step (but the kinds in `without`,
    which the scenario has none of), zombies stopped by fencing, epochs committed and replays
    recognised (a suite that never crashes proves nothing)."""
    print(stats)
    assert stats.examples >= examples
    assert set(stats.crashes) >= EVERY_STEP_KIND - without, stats.crashes
    assert not set(stats.crashes) & without, stats.crashes
    assert stats.zombies["FencedError"] > 0, stats.zombies
    assert stats.epochs_committed > examples
    assert stats.replays_recognised > 0


def check_dead_letters(stats: ConformanceStats, reasons: set[str]) -> None:
    """A dead-letter scenario really explored (check_exercised with DEAD_LETTER_EXAMPLES)
    and committed dead letters of every reason in `reasons`."""
    check_exercised(stats, examples=DEAD_LETTER_EXAMPLES)
    assert set(stats.dead_letters) >= reasons, stats.dead_letters


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_file_sink_alone() -> None:
    before = open_descriptors()
    stats = run_conformance(
        scenario_of(lambda f: FileTarget(f / "files")), max_examples=CONFORMANCE_SAMPLE
    )
    check_exercised(stats)
    gc.collect()
    # Abandoned coordinators must not leak descriptors (they once pushed later tests' sockets
    # past select()'s limit of 1024).
    assert open_descriptors() - before < 20


def test_the_scripted_sweep_crashes_at_every_step_kind() -> None:
    """Coverage of the crash points does not depend on the generated sample: the sweep alone
    (one generated example beside it) crashes at every kind of step."""
    stats = run_conformance(scenario_of(lambda f: FileTarget(f / "files")), max_examples=1)
    assert stats.scripted == 13
    assert set(stats.crashes) >= EVERY_STEP_KIND | {"recovery:after-resolve"}, stats.crashes
    assert stats.zombies["FencedError"] > 0, stats.zombies
    assert stats.replays_recognised >= stats.scripted


def test_two_file_sinks_in_one_job() -> None:
    stats = run_conformance(
        scenario_of(lambda f: FileTarget(f / "a", "a"), lambda f: FileTarget(f / "b", "b")),
        max_examples=CONFORMANCE_SAMPLE,
    )
    check_exercised(stats)


def test_file_sink_with_a_last_resource() -> None:
    stats = run_conformance(
        scenario_of(lambda f: FileTarget(f / "files"), lambda f: JournalTarget(f / "journal")),
        max_examples=CONFORMANCE_SAMPLE,
    )
    check_exercised(stats)


def test_a_row_refused_by_one_target_still_lands_in_the_other() -> None:
    """Two targets, one refusing, and a files dead-letter sink: a refused row is in the other
    target and in the dead letter (naming the refusing sink, with its reason), never in the
    refusing one; after every crash and replay each row is in exactly one of the refusing
    target or the dead letter, once; a crash can fall between the three participants'
    commits, and nothing is left prepared."""
    stats = run_conformance(
        scenario_of(
            lambda f: FileTarget(
                f / "a", "a", RefusingConformanceFileSink, bad_rows=CONFORMANCE_BAD_ROWS
            ),
            lambda f: FileTarget(f / "b", "b"),
            dead_letter=files_dead_letter,
        ),
        max_examples=DEAD_LETTER_SAMPLE,
    )
    check_dead_letters(stats, {"check", "too_long"})
