"""The writer's record per epoch and its Prometheus metrics, without Spark and without an HTTP
server: real epochs of a coordinator over file sinks, the metric families on a registry of
their own, read back as Prometheus's text format."""

from __future__ import annotations

import ast
import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from durable_sinks.coordinator import Coordinator, EpochResult, JobTotals, RecoveryReport
from durable_sinks.coordinator._metrics import PHASES
from durable_sinks.core.errors import ConfigError, OutageError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.spark import JobOptions
from durable_sinks.spark._observe import (
    EPOCH_LOGGER,
    BatchObserver,
    add_totals,
    counters,
    epoch_record,
    in_doubt,
    increments,
    observe,
)
from durable_sinks.spark._prometheus import COUNTERS, Families, require_client

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-pw"


def committed_epochs(tmp_path: Path, n: int) -> tuple[Coordinator, list[EpochResult]]:
    """`n` epochs of 4 rows each through two file sinks, then epoch 0 replayed."""
    sinks = [FolderSink(Files(str(tmp_path / name), name=name)) for name in ("a", "b")]
    coordinator = Coordinator("orders", list(sinks), LocalDirectoryStore(tmp_path / "store"))
    coordinator.start()
    rows = pa.record_batch({"id": [1, 2, 3, 4]})
    results = [coordinator.run_epoch(epoch, [rows]) for epoch in range(n)]
    results.append(coordinator.run_epoch(0, [rows]))
    return coordinator, results


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the registry's text exposition: (name, sorted labels) -> value."""
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


# -- the option -------------------------------------------------------------------------------


@pytest.mark.parametrize("port", [-1, 65536, True, 1.5, "9464"])
def test_a_bad_metrics_port_is_refused_with_the_fix(port: object) -> None:
    with pytest.raises(ConfigError, match="metrics_port") as caught:
        JobOptions.split({"job_id": "orders", "metrics_port": port})
    assert caught.value.fix


@pytest.mark.parametrize("port", [None, 0, 9464, 65535])
def test_metrics_port_takes_a_port_zero_or_none(port: int | None) -> None:
    job, rest = JobOptions.split({"job_id": "orders", "metrics_port": port})
    assert (job.metrics_port, rest) == (port, {})
    assert JobOptions("orders").metrics_port is None


def test_without_prometheus_client_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    with pytest.raises(ConfigError, match="prometheus-client") as caught:
        require_client()
    assert "pip install 'durable-sinks[metrics]'" in str(caught.value.fix)


def test_only_the_prometheus_module_imports_prometheus_client_and_only_when_asked() -> None:
    importers = []
    for folder in ("src/durable_sinks", "coordinator", "sinks", "manifest"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if any(n.split(".")[0] == "prometheus_client" for n in names):
                    importers.append(path.relative_to(REPO).as_posix())
    assert sorted(set(importers)) == ["src/durable_sinks/spark/_prometheus.py"]
    probe = (
        "import sys\n"
        "import durable_sinks.spark._writer, durable_sinks.spark._prometheus\n"
        "print('prometheus_client' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


# -- counters across coordinators -------------------------------------------------------------


def test_totals_add_field_by_field_and_counters_read_replay_mismatches_when_present() -> None:
    a = JobTotals(epochs_committed=2, rows=8, recovered_commits=1)
    b = JobTotals(epochs_committed=1, epochs_skipped=1, rows=4)
    summed = add_totals(a, b)
    assert (summed.epochs_committed, summed.epochs_skipped, summed.rows) == (3, 1, 12)
    assert summed.recovered_commits == 1
    assert add_totals(a, None) == a
    assert add_totals(a, None) is not a

    assert counters(summed, failed_batches=1, failed_attempts=3) == {
        "epochs_committed": 3,
        "epochs_already_committed": 1,
        "epochs_failed": 1,
        "epochs_retried": 3,
        "recovered_commits": 1,
        "recovered_rollbacks": 0,
        "replay_mismatches": 0,
    }

    @dataclasses.dataclass
    class Later(JobTotals):  # JobTotals as another change extends it
        replay_mismatches: int = 0

    assert (
        counters(Later(replay_mismatches=2), failed_batches=0, failed_attempts=0)[
            "replay_mismatches"
        ]
        == 2
    )
    assert set(COUNTERS) == set(counters(summed, failed_batches=0, failed_attempts=0))


def test_the_observer_keeps_the_counters_of_the_coordinators_it_saw_closed() -> None:
    observer = BatchObserver("orders", "driver")
    assert observer.totals(None) == JobTotals()
    observer.closed(JobTotals(epochs_committed=3, epochs_failed=1, recovered_rollbacks=2))
    observer.closed(JobTotals(epochs_committed=1))
    now = observer.totals(JobTotals(epochs_committed=2, recovered_commits=1))
    assert (now.epochs_committed, now.epochs_failed) == (6, 1)
    assert (now.recovered_commits, now.recovered_rollbacks) == (1, 2)


def test_increments_are_what_each_counter_grew_by() -> None:
    assert increments({}, {"a": 2, "b": 0}) == {"a": 2}
    assert increments({"a": 2, "b": 1}, {"a": 5, "b": 1}) == {"a": 3}
    assert increments({"a": 5}, {"a": 2}) == {"a": 2}  # restarted from 0: counts again


def test_in_doubt_counts_what_the_last_recovery_found() -> None:
    assert in_doubt(None) == 0
    assert in_doubt(RecoveryReport(3)) == 0
    assert in_doubt(RecoveryReport(3, ran=False)) == 0
    report = RecoveryReport(3)
    report.committed.extend([object(), object()])  # type: ignore[list-item]
    report.adopted.append(object())  # type: ignore[arg-type]
    assert in_doubt(report) == 3


# -- the record per epoch ---------------------------------------------------------------------


def test_the_epoch_record_holds_the_facts_as_json(tmp_path: Path) -> None:
    _, results = committed_epochs(tmp_path, 1)
    record = epoch_record(
        "orders", 0, results[0], seconds=0.25, attempts=2, generation=7, execution="driver"
    )
    assert json.loads(json.dumps(record)) == record
    assert record["outcome"] == "committed"
    assert (record["job"], record["epoch"], record["attempts"], record["generation"]) == (
        "orders",
        0,
        2,
        7,
    )
    assert record["rows"] == {"a": 4, "b": 4}
    assert set(record["bytes"]) == {"a", "b"}
    assert set(record["ms"]) == set(PHASES)
    assert record["total_ms"] == 250.0
    assert record["decision_generation"] == results[0].decision.generation

    replay = epoch_record(
        "orders", 0, results[-1], seconds=0.01, attempts=1, generation=7, execution="driver"
    )
    assert (replay["outcome"], replay["rows"]) == ("already_committed", {})

    error = OutageError(f"password={SECRET} refused", job="orders", epoch=3)
    failed = epoch_record(
        "orders", 3, None, seconds=1.0, attempts=4, generation=8, execution="driver", error=error
    )
    assert failed["outcome"] == "failed"
    assert failed["error"] == "OutageError"
    assert SECRET not in json.dumps(failed)  # the class only, never the message


def test_one_info_record_per_batch_on_the_epochs_logger(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    coordinator, results = committed_epochs(tmp_path, 2)
    observer = BatchObserver("orders", "driver")
    caplog.set_level(logging.INFO, logger=EPOCH_LOGGER)
    for result in results:
        observer.batch(
            result.epoch,
            result,
            seconds=0.1,
            attempts=1,
            failed_attempts=0,
            generation=1,
            current=coordinator.totals,
            recovery=None,
        )
    observer.batch(
        2,
        None,
        seconds=0.3,
        attempts=3,
        failed_attempts=2,
        generation=2,
        current=None,
        recovery=None,
        error=OutageError("gone", job="orders", epoch=2),
    )
    records = [r for r in caplog.records if r.name == EPOCH_LOGGER]
    assert [r.levelno for r in records] == [logging.INFO] * 4
    facts = [json.loads(r.ds_epoch_json) for r in records]  # type: ignore[attr-defined]
    assert facts == [r.ds_epoch_record for r in records]  # type: ignore[attr-defined]
    assert [(f["epoch"], f["outcome"]) for f in facts] == [
        (0, "committed"),
        (1, "committed"),
        (0, "already_committed"),
        (2, "failed"),
    ]
    assert records[0].getMessage().startswith("job=orders sink=- epoch=0: committed: 8 rows in")
    assert records[-1].getMessage().endswith(": OutageError, 3 attempts")
    assert records[0].ds_epoch == 0  # type: ignore[attr-defined]
    assert observer.failed_batches == 1


# -- the metric families ----------------------------------------------------------------------


def test_metrics_count_epochs_rows_and_phases_and_writers_add_up(tmp_path: Path) -> None:
    coordinator, results = committed_epochs(tmp_path, 2)
    registry = CollectorRegistry()
    families = Families(registry)
    families.add_job("orders")
    before = samples(registry)
    assert before[("durable_sinks_epochs_committed_total", (("job", "orders"),))] == 0

    totals = coordinator.totals
    counts = counters(totals, failed_batches=1, failed_attempts=2)
    added: dict[str, int] = {}
    for result in results:
        seen = observe("orders", result.epoch, result, seconds=0.5, counts=counts, recovery=None)
        families.record(seen, increments(added, seen.counters))
        added = dict(seen.counters)
    # A second writer of the same job in this process adds its own.
    seen = observe("orders", 5, results[0], seconds=0.5, counts=counts, recovery=None)
    families.record(seen, increments({}, seen.counters))

    got = samples(registry)
    job = (("job", "orders"),)
    assert got[("durable_sinks_epochs_committed_total", job)] == 2 * totals.epochs_committed
    assert got[("durable_sinks_epochs_already_committed_total", job)] == 2
    assert got[("durable_sinks_epochs_failed_total", job)] == 2
    assert got[("durable_sinks_epochs_retried_total", job)] == 4
    assert got[("durable_sinks_rows_total", (("job", "orders"), ("sink", "a")))] == 12
    assert got[("durable_sinks_rows_total", (("job", "orders"), ("sink", "b")))] == 12
    assert got[("durable_sinks_bytes_total", (("job", "orders"), ("sink", "a")))] > 0
    assert got[("durable_sinks_last_committed_epoch", job)] == 5
    assert got[("durable_sinks_prepared_in_doubt", job)] == 0
    total = (("job", "orders"), ("phase", "total"))
    assert got[("durable_sinks_epoch_phase_seconds_count", total)] == 4
    assert got[("durable_sinks_epoch_phase_seconds_sum", total)] == 2.0
    write = (("job", "orders"), ("phase", "write"))
    assert got[("durable_sinks_epoch_phase_seconds_count", write)] == 3  # not the replay


def test_a_failed_batch_counts_and_never_moves_the_last_committed_epoch() -> None:
    registry = CollectorRegistry()
    families = Families(registry)
    ok = observe("j", 4, None, seconds=1.0, counts={"epochs_failed": 1}, recovery=None)
    families.record(ok, {"epochs_failed": 1})
    got = samples(registry)
    assert got[("durable_sinks_epochs_failed_total", (("job", "j"),))] == 1
    assert ("durable_sinks_last_committed_epoch", (("job", "j"),)) not in got
    assert got[("durable_sinks_epoch_phase_seconds_count", (("job", "j"), ("phase", "total")))]
