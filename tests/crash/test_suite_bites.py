"""The conformance suite fails on each deliberately broken implementation (tests/crash/broken.py),
and passes on the real one with the same settings: it is the breakage that is caught."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_sinks.coordinator import Coordinator
from durable_sinks.core.errors import DurableSinkError
from durable_sinks.manifest import DecisionStore, LocalDirectoryStore
from durable_sinks.sinks.folder import FolderSink
from durable_sinks.testing import Scenario, run_conformance
from tests.crash import broken
from tests.crash.test_file_sink_conformance import files_dead_letter
from tests.support.refusing_sink import CONFORMANCE_BAD_ROWS, RefusingConformanceFileSink
from tests.support.targets import FileTarget

EXAMPLES = 30
#: Dead-letter scenarios: the sweep, which crashes at every participant's steps, catches their
#: breakages.
DEAD_LETTER_EXAMPLES = 1


def scenario(
    sink_class: type[FolderSink] = FolderSink,
    coordinator_class: type[Coordinator] = Coordinator,
    store_class: Callable[[Path], DecisionStore] = LocalDirectoryStore,
    *,
    dead_letter: bool = False,
) -> Callable[[], Scenario]:
    """With `dead_letter`, the target refuses rows (CONFORMANCE_BAD_ROWS) into a files
    dead-letter sink."""

    def make() -> Scenario:
        folder = Path(tempfile.mkdtemp(prefix="ds-bites-"))
        bad_rows = CONFORMANCE_BAD_ROWS if dead_letter else None
        return Scenario(
            job_id="bites",
            targets=[FileTarget(folder / "files", sink_class=sink_class, bad_rows=bad_rows)],
            store=lambda: store_class(folder / "store"),
            cleanup=lambda: shutil.rmtree(folder, ignore_errors=True),
            coordinator_class=coordinator_class,
            dead_letter=files_dead_letter(folder) if dead_letter else None,
        )

    return make


BROKEN = {
    "commit not idempotent": scenario(sink_class=broken.NonIdempotentCommitSink),
    "rollback that commits": scenario(sink_class=broken.RollbackCommitsSink),
    "decision written after commit": scenario(
        coordinator_class=broken.DecisionAfterCommitCoordinator
    ),
    "marker missing from the data transaction": scenario(
        sink_class=broken.MarkerOutsideTransactionSink
    ),
    "zombie not fenced": scenario(store_class=broken.UnfencedStore),
    "refused rows written to the target too": scenario(
        broken.WritesRefusedRowsToo, dead_letter=True
    ),
    "refused rows never reported": scenario(broken.DropsRefusedRows, dead_letter=True),
    "dead letters visible before the decision": scenario(
        RefusingConformanceFileSink,
        broken.DeadLettersBeforeDecisionCoordinator,
        dead_letter=True,
    ),
}


DEAD_LETTER_BREAKAGES = {
    "refused rows written to the target too",
    "refused rows never reported",
    "dead letters visible before the decision",
}


def examples(breakage: str) -> int:
    return DEAD_LETTER_EXAMPLES if breakage in DEAD_LETTER_BREAKAGES else EXAMPLES


@pytest.mark.parametrize("breakage", sorted(BROKEN))
def test_suite_catches(breakage: str) -> None:
    with pytest.raises((AssertionError, DurableSinkError)) as caught:
        run_conformance(BROKEN[breakage], max_examples=examples(breakage), expect_failure=True)
    print(f"{breakage}: caught {type(caught.value).__name__}: {caught.value}")


def test_same_settings_pass_on_the_real_implementation() -> None:
    run_conformance(scenario(), max_examples=EXAMPLES, expect_failure=True)


def test_same_settings_pass_on_the_real_dead_letter_routing() -> None:
    run_conformance(
        scenario(RefusingConformanceFileSink, dead_letter=True),
        max_examples=DEAD_LETTER_EXAMPLES,
        expect_failure=True,
    )
