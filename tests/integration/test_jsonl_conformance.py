"""The conformance suite against the reference JSON Lines sink: alone, two in one job, with
a last resource (the journal sink, Kafka's commit semantics), and the `ledger` kind that a
test distribution registers through the entry-point group (tests/support/plugin_sink)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.testing import Scenario, Target, run_conformance
from tests.crash.test_file_sink_conformance import check_exercised
from tests.support.jsonl_target import JsonlTarget
from tests.support.targets import JournalTarget
from tests.support.tiers import CONFORMANCE_SAMPLE


def scenario_of(*make_targets: Callable[[Path], Target]) -> Callable[[], Scenario]:
    def make() -> Scenario:
        folder = Path(tempfile.mkdtemp(prefix="ds-jsonl-conformance-"))
        targets = [make(folder) for make in make_targets]

        def cleanup() -> None:
            leftovers = [name for target in targets for name in target.leftovers()]
            shutil.rmtree(folder, ignore_errors=True)
            assert not leftovers, f"left behind: {leftovers}"

        return Scenario(
            job_id="conformance",
            targets=targets,
            store=lambda: LocalDirectoryStore(folder / "store"),
            cleanup=cleanup,
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
