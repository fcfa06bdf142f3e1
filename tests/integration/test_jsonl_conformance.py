"""The conformance suite against the reference JSON Lines sink: alone, two in one job, with
a last resource (the journal sink, Kafka's commit semantics), the `ledger` kind that a
test distribution registers through the entry-point group (tests/support/plugin_sink), and
refusing rows into a JSON Lines dead-letter sink (on_bad_rows="dead_letter")."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.testing import DEAD_LETTER_COLUMNS, Scenario, Target, run_conformance
from tests.crash.test_file_sink_conformance import check_dead_letters, check_exercised
from tests.support.jsonl_target import JsonlTarget
from tests.support.refusing_sink import CONFORMANCE_BAD_ROWS, RefusingConformanceJsonlSink
from tests.support.targets import JournalTarget
from tests.support.tiers import CONFORMANCE_SAMPLE, DEAD_LETTER_SAMPLE


def scenario_of(
    *make_targets: Callable[[Path], Target], dead_letter: Callable[[Path], Target] | None = None
) -> Callable[[], Scenario]:
    def make() -> Scenario:
        folder = Path(tempfile.mkdtemp(prefix="ds-jsonl-conformance-"))
        targets = [make(folder) for make in make_targets]
        letters = None if dead_letter is None else dead_letter(folder)

        def cleanup() -> None:
            every = [*targets, *([letters] if letters is not None else [])]
            leftovers = [name for target in every for name in target.leftovers()]
            shutil.rmtree(folder, ignore_errors=True)
            assert not leftovers, f"left behind: {leftovers}"

        return Scenario(
            job_id="conformance",
            targets=targets,
            store=lambda: LocalDirectoryStore(folder / "store"),
            cleanup=cleanup,
            dead_letter=letters,
        )

    return make


def test_jsonl_sink_alone() -> None:
    stats = run_conformance(
        scenario_of(lambda f: JsonlTarget(f / "jsonl")), max_examples=CONFORMANCE_SAMPLE
    )
    check_exercised(stats)


def test_two_jsonl_sinks_and_a_last_resource_in_one_job() -> None:
    stats = run_conformance(
        scenario_of(
            lambda f: JsonlTarget(f / "a", "a"),
            lambda f: JsonlTarget(f / "b", "b"),
            lambda f: JournalTarget(f / "journal"),
        ),
        max_examples=CONFORMANCE_SAMPLE,
    )
    check_exercised(stats)


def test_a_sink_kind_installed_by_entry_point(plugin_dists: Path) -> None:
    stats = run_conformance(
        scenario_of(lambda f: JsonlTarget(f / "ledger", "ledger", kind="ledger")),
        max_examples=CONFORMANCE_SAMPLE,
    )
    check_exercised(stats)


def test_jsonl_sink_refusing_rows_into_a_jsonl_dead_letter() -> None:
    """The reference sink refusing rows (a check and a length limit) into a dead-letter sink
    of the same kind, beside the journal last resource: every row of every epoch is in exactly
    one of its target or the dead letter, with its reason, after every crash and replay."""
    stats = run_conformance(
        scenario_of(
            lambda f: JsonlTarget(
                f / "jsonl",
                sink_class=RefusingConformanceJsonlSink,
                bad_rows=CONFORMANCE_BAD_ROWS,
            ),
            lambda f: JournalTarget(f / "journal"),
            dead_letter=lambda f: JsonlTarget(
                f / "dead", "dead_letters", columns=DEAD_LETTER_COLUMNS
            ),
        ),
        max_examples=DEAD_LETTER_SAMPLE,
    )
    check_dead_letters(stats, {"check", "too_long"})
