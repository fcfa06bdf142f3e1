"""Validation at job start names the sink, what is missing and the fix; the recovery table."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_sinks.coordinator import Resolution, resolve, validate
from durable_sinks.coordinator.validation import transaction_members
from durable_sinks.core import CommitHandle, DeliveryGuarantee, SinkCapabilities, SinkConnector
from durable_sinks.core.bad_rows import BadRowPolicy, WritePolicy
from durable_sinks.core.errors import CapabilityError, ConfigError
from durable_sinks.manifest import DecisionRecord, LocalDirectoryStore, MemoryDecisionStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.support.journal_sink import JournalSink


class Limited(FolderSink):
    def __init__(self, path: Path, name: str, caps: SinkCapabilities) -> None:
        super().__init__(Files(str(path), name=name))
        self._caps = caps

    def capabilities(self) -> SinkCapabilities:
        return self._caps


DEAD_LETTERS = WritePolicy(on_bad_rows=BadRowPolicy.DEAD_LETTER)


def files(path: Path, name: str = "files") -> FolderSink:
    return FolderSink(Files(str(path / name), name=name))


def test_a_plain_file_job_validates(tmp_path: Path) -> None:
    assert validate("job", [files(tmp_path)], LocalDirectoryStore(tmp_path)) is None


def test_exactly_once_needs_a_durable_store(tmp_path: Path) -> None:
    with pytest.raises(CapabilityError, match="durable decision store") as raised:
        validate("job", [files(tmp_path)], MemoryDecisionStore())
    assert raised.value.fix is not None
    assert "LocalDirectoryStore" in raised.value.fix
    validate("job", [files(tmp_path)], MemoryDecisionStore(), DeliveryGuarantee.AT_LEAST_ONCE)


def test_every_sink_must_be_exactly_once(tmp_path: Path) -> None:
    weak = Limited(tmp_path, "weak", SinkCapabilities(two_phase_commit=True))
    with pytest.raises(CapabilityError, match="cannot give exactly-once") as raised:
        validate("job", [files(tmp_path), weak], LocalDirectoryStore(tmp_path))
    assert raised.value.sink == "weak"
    assert "AT_LEAST_ONCE" in (raised.value.fix or "")


def test_exactly_once_needs_two_phase_commit(tmp_path: Path) -> None:
    sink = Limited(tmp_path, "one-phase", SinkCapabilities(exactly_once=True))
    with pytest.raises(CapabilityError, match="two-phase commit"):
        validate("job", [sink], LocalDirectoryStore(tmp_path))


def test_executor_mode_needs_distributed_prepare(tmp_path: Path) -> None:
    journal = JournalSink(tmp_path / "journal")
    with pytest.raises(CapabilityError, match="executor mode") as raised:
        validate(
            "job", [files(tmp_path), journal], LocalDirectoryStore(tmp_path), executor_mode=True
        )
    assert raised.value.sink == "journal"
    assert "driver mode" in (raised.value.fix or "")


def test_at_most_one_last_resource(tmp_path: Path) -> None:
    one = JournalSink(tmp_path / "j1", name="j1")
    assert validate("job", [files(tmp_path), one], LocalDirectoryStore(tmp_path)) is one
    two = JournalSink(tmp_path / "j2", name="j2")
    with pytest.raises(CapabilityError, match=r"\['j1', 'j2'\]"):
        validate("job", [one, two], LocalDirectoryStore(tmp_path))


class GroupedJournal(JournalSink):
    """A journal sink that shares one transaction with the others of its group."""

    def __init__(self, path: Path, name: str, group: str) -> None:
        super().__init__(path, name=name)
        self.group = group

    def transaction_group(self) -> str:
        return self.group


def test_last_resources_of_one_transaction_group_fit_in_one_job(tmp_path: Path) -> None:
    store = LocalDirectoryStore(tmp_path)
    one = GroupedJournal(tmp_path / "j1", "j1", "cluster a")
    two = GroupedJournal(tmp_path / "j2", "j2", "cluster a")
    other = GroupedJournal(tmp_path / "j3", "j3", "cluster b")
    sinks: list[SinkConnector] = [files(tmp_path), one, two]
    assert validate("job", sinks, store) is one
    assert transaction_members(sinks, one) == ("j1", "j2")
    assert transaction_members([files(tmp_path), one], one) == ()  # alone: its own
    # the carrier is a target, not the dead letter (which joins only some epochs)
    assert validate("job", [two, one], store, dead_letter=two, policy=DEAD_LETTERS) is one
    assert transaction_members([two, one], one) == ("j1", "j2")
    with pytest.raises(CapabilityError, match="do not share one transaction") as raised:
        validate("job", [one, other], store)
    assert "'j1': cluster a; 'j3': cluster b" in raised.value.message
    assert "the same bootstrap_servers" in (raised.value.fix or "")


def test_a_non_resumable_sink_must_carry_the_decision(tmp_path: Path) -> None:
    sink = Limited(tmp_path, "fragile", SinkCapabilities(exactly_once=True, two_phase_commit=True))
    with pytest.raises(CapabilityError, match="cannot carry the commit decision") as raised:
        validate("job", [sink], LocalDirectoryStore(tmp_path))
    assert "LastResource" in (raised.value.fix or "")


def test_a_lone_sink_that_can_carry_the_decision_is_committed_in_one_phase(
    tmp_path: Path,
) -> None:
    # Building a PostgresSink connects to nothing: validation is pure logic.
    lone = PostgresSink(Postgres("host=127.0.0.1 dbname=none", "public.events"))
    store = LocalDirectoryStore(tmp_path)
    assert validate("job", [lone], store) is lone
    assert validate("job", [lone], store, one_phase=False) is None
    assert validate("job", [lone], store, executor_mode=True) is None  # a participant per task
    assert validate("job", [lone, files(tmp_path)], store) is None  # two participants: 2PC
    journal = JournalSink(tmp_path / "journal")
    assert validate("job", [lone, journal], store) is journal  # the non-resumable one decides
    assert validate("job", [files(tmp_path)], store) is None  # cannot carry a decision


def test_config_mistakes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="job_id is empty"):
        validate(" ", [files(tmp_path)], LocalDirectoryStore(tmp_path))
    with pytest.raises(ConfigError, match="no sinks"):
        validate("job", [], LocalDirectoryStore(tmp_path))
    with pytest.raises(ConfigError, match=r"\['files'\] are used more than once"):
        validate("job", [files(tmp_path), files(tmp_path)], LocalDirectoryStore(tmp_path))


def test_recovery_table() -> None:
    mine = CommitHandle("pg", 4, "ds:j:pg:4:0:1-0", 1, 1, "c")
    other_attempt = CommitHandle("pg", 4, "ds:j:pg:4:0:2-0", 1, 1, "c")
    decided = DecisionRecord("j", 4, 1, (mine,))
    assert resolve(decided, mine) is Resolution.COMMIT
    assert resolve(decided, other_attempt) is Resolution.ROLL_BACK
    assert resolve(None, mine) is Resolution.ROLL_BACK
