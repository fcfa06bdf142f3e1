"""A job whose only sink keeps its decisions needs no decision store: HostedDecisionStore over
a DecisionHost, with a journal sink standing in for Kafka (its commit carries the decision,
its prepared epoch dies with the writer); validation refuses such a store for any other job;
a Delta table's folder hosts the store of a job that names none."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome, validate
from durable_sinks.core import DecisionHost, DecisionHostingSink, DeliveryGuarantee
from durable_sinks.core.errors import CapabilityError, UsageError
from durable_sinks.core.protocol import JSON
from durable_sinks.manifest import (
    DecisionRecord,
    HostedDecisionStore,
    LocalDirectoryStore,
    default_store_for,
)
from durable_sinks.manifest.s3 import S3DecisionStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.testing import SCHEMA
from tests.support.journal_sink import JournalSink


class JournalHost:
    """The journal's folder as a DecisionHost: generations in `generation` (a counter file),
    decisions read from the committed segments."""

    def __init__(self, path: Path, sink: str) -> None:
        self.path = path
        self._sink = sink
        self.closed = False

    @property
    def sink(self) -> str:
        return self._sink

    def _counter(self) -> Path:
        return self.path / "generation"

    def claim_generation(self, job_id: str) -> int:
        claimed = self.newest_generation(job_id) + 1
        self.path.mkdir(parents=True, exist_ok=True)
        self._counter().write_text(json.dumps(claimed))
        return claimed

    def newest_generation(self, job_id: str) -> int:
        counter = self._counter()
        return int(json.loads(counter.read_text())) if counter.exists() else 0

    def decision(self, job_id: str, epoch: int) -> Mapping[str, JSON] | None:
        return JournalSink(self.path, self._sink).read_decision(epoch)

    def latest_decided(self, job_id: str) -> int | None:
        segments = JournalSink(self.path, self._sink)._segments()
        return max((int(p.stem) for p in segments), default=None)

    def close(self) -> None:
        self.closed = True


class HostingJournal(JournalSink):
    def decision_host(self) -> DecisionHost:
        return JournalHost(self.path, self.name)


def batch(*keys: str) -> pa.RecordBatch:
    rows = [{"key": k, "n": i, "text": None, "x": None, "flag": None} for i, k in enumerate(keys)]
    return pa.RecordBatch.from_pylist(rows, SCHEMA)


def hosted(path: Path) -> tuple[HostingJournal, HostedDecisionStore]:
    sink = HostingJournal(path)
    return sink, HostedDecisionStore(sink.decision_host())


def test_the_protocols_recognise_a_hosting_sink_and_its_host(tmp_path: Path) -> None:
    sink, store = hosted(tmp_path)
    assert isinstance(sink, DecisionHostingSink)
    assert isinstance(store.host, DecisionHost)
    assert not isinstance(JournalSink(tmp_path), DecisionHostingSink)
    assert store.durable
    assert store.sink == "journal"


def test_epochs_commit_once_with_the_decision_in_the_sink(tmp_path: Path) -> None:
    sink, store = hosted(tmp_path)
    coordinator = Coordinator("job", [sink], store)
    assert coordinator.start().generation == 1
    assert coordinator.decisions.hosted_by_last
    assert not coordinator.decisions.caches_decisions
    assert not coordinator.decisions.store_holds_decisions
    first = coordinator.run_epoch(0, [batch("a", "b")])
    assert first.outcome is EpochOutcome.COMMITTED
    assert coordinator.run_epoch(1, [batch("c")]).outcome is EpochOutcome.COMMITTED
    # The store reads the decisions the sink's commits carried; nothing else wrote them.
    assert store.get(0) == first.decision
    assert store.is_finished(0)
    assert store.latest_epoch() == 1
    assert store.expire(5) == 0
    assert store.get(0) is not None
    assert store.peek("job", 1) is not None
    assert store.peek("job", 2) is None
    coordinator.close()
    assert isinstance(store.host, JournalHost)
    assert store.host.closed

    # A restarted driver: a new generation; Spark replays epoch 1, which had landed.
    sink2, store2 = hosted(tmp_path)
    again = Coordinator("job", [sink2], store2)
    assert again.start().generation == 2
    replay = again.run_epoch(1, [batch("c")])
    assert replay.outcome is EpochOutcome.ALREADY_COMMITTED
    assert replay.decision.generation == 1
    assert again.run_epoch(2, [batch("d")]).outcome is EpochOutcome.COMMITTED
    keys = [row[0] for row in JournalSink.read_rows(tmp_path)]
    assert sorted(keys) == ["a", "b", "c", "d"]


def test_a_crash_right_after_the_commit_point_is_finished_by_the_next_driver(
    tmp_path: Path,
) -> None:
    sink, store = hosted(tmp_path)
    coordinator = Coordinator("job", [sink], store)
    coordinator.start()
    steps = coordinator.epoch_steps(0, [batch("a")])
    while next(steps) != "after-decision":
        pass  # the driver dies here: the generator is abandoned
    sink2, store2 = hosted(tmp_path)
    again = Coordinator("job", [sink2], store2)
    again.start()
    assert again.decision(0) is not None
    assert again.run_epoch(0, [batch("a")]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert [row[0] for row in JournalSink.read_rows(tmp_path)] == ["a"]


def test_an_older_driver_is_fenced_once_a_newer_one_claimed(tmp_path: Path) -> None:
    sink, store = hosted(tmp_path)
    old = Coordinator("job", [sink], store)
    old.start()
    new_sink, new_store = hosted(tmp_path)
    new = Coordinator("job", [new_sink], new_store)
    new.start()
    with pytest.raises(Exception, match="newer generation"):
        old.run_epoch(0, [batch("zombie")])
    assert new.run_epoch(0, [batch("a")]).outcome is EpochOutcome.COMMITTED
    assert [row[0] for row in JournalSink.read_rows(tmp_path)] == ["a"]


def test_put_only_confirms_what_the_sink_committed(tmp_path: Path) -> None:
    sink, store = hosted(tmp_path)
    with pytest.raises(UsageError, match="not open"):
        store.get(0)
    coordinator = Coordinator("job", [sink], store)
    coordinator.start()
    committed = coordinator.run_epoch(0, [batch("a")]).decision
    assert store.put(committed) == committed
    stray = DecisionRecord("job", 1, 1, ())
    with pytest.raises(UsageError, match="cannot be written apart from that commit") as raised:
        store.put(stray)
    assert "decision_store" in (raised.value.fix or "")
    assert store.get(1) is None


def test_validation_refuses_a_hosted_store_for_any_other_job(tmp_path: Path) -> None:
    sink, store = hosted(tmp_path / "j")
    assert validate("job", [sink], store) is sink
    files = FolderSink(Files(str(tmp_path / "files"), name="files"))
    with pytest.raises(CapabilityError, match="kept by sink 'journal'") as raised:
        validate("job", [files, sink], store)
    assert raised.value.sink == "journal"
    assert "decision_store" in (raised.value.fix or "")
    with pytest.raises(CapabilityError, match="kept by sink 'journal'"):
        validate("job", [HostingJournal(tmp_path / "k", name="other")], store)
    # A last resource decides with its commit whether or not one-phase commit is asked for.
    assert validate("job", [sink], store, one_phase=False) is sink
    # At least once: no decision is needed, the host only fences generations.
    assert validate("job", [sink], store, DeliveryGuarantee.AT_LEAST_ONCE) is None


def test_a_delta_tables_folder_hosts_the_store_of_a_job_that_names_none(tmp_path: Path) -> None:
    local = default_store_for("delta", {"path": str(tmp_path / "events"), "name": "lake"})
    assert isinstance(local, LocalDirectoryStore)
    assert os.fspath(local.path) == str(tmp_path / "events" / "_decisions")
    uri = default_store_for("delta", {"path": f"file://{tmp_path}/events"})
    assert isinstance(uri, LocalDirectoryStore)
    assert os.fspath(uri.path) == str(tmp_path / "events" / "_decisions")
    remote = default_store_for(
        "delta", {"path": "s3a://lake/tables/events", "name": "lake", "region": "eu-west-1"}
    )
    assert isinstance(remote, S3DecisionStore)
    assert str(remote.location) == "s3://lake/tables/events/_decisions"
    assert remote.connection.region == "eu-west-1"
    assert "delta sink 'lake'" in remote.where
    assert default_store_for("delta", {"name": "no-path"}) is None
    assert default_store_for("kafka", {"topic": "t"}) is None
