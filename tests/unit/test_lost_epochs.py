"""Committed epochs a target lost (coordinator/_lost_epochs.py), with files sinks and local
stores (no server): each loss is found when the next coordinator starts or reaches its first
epoch, before anything is written; every legitimate history passes."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from durable_sinks import CommittedEpochLostError
from durable_sinks.cli import main
from durable_sinks.coordinator import Coordinator, EpochOutcome, prepare_part
from durable_sinks.core import CommitHandle, DeliveryGuarantee
from durable_sinks.core.bad_rows import BadRowCap, BadRowPolicy, WritePolicy
from durable_sinks.core.errors import EpochOrderError, ParticipantLostError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import STAGING, Files, FolderSink
from tests.support.journal_sink import JournalSink
from tests.support.refusing_sink import RefusingFileSink


def rows(epoch: int, *values: int) -> list[pa.RecordBatch]:
    values = values or (1, 2)
    return [pa.record_batch({"key": [f"{epoch}:{i}" for i in range(len(values))], "v": values})]


def files(tmp_path: Path, name: str) -> FolderSink:
    return FolderSink(Files(str(tmp_path / name), name=name))


def job(tmp_path: Path, *names: str, recover: bool = True, **kwargs: object) -> Coordinator:
    """A started coordinator of job "job" over files sinks `names` (default "a", "b")."""
    made = Coordinator(
        "job",
        [files(tmp_path, n) for n in names or ("a", "b")],
        LocalDirectoryStore(tmp_path / "store"),
        **kwargs,  # type: ignore[arg-type]
    )
    made.start(recover=recover)
    return made


def run(coordinator: Coordinator, *epochs: int) -> None:
    for epoch in epochs:
        assert coordinator.run_epoch(epoch, rows(epoch)).outcome is EpochOutcome.COMMITTED
    coordinator.close()


def lose(tmp_path: Path, sink: str, *epochs: int) -> None:
    """Take committed epochs away from a files sink, as a restore from an older backup."""
    for epoch in epochs:
        shutil.rmtree(tmp_path / sink / f"epoch={epoch}")


def forget_decisions(tmp_path: Path, *epochs: int) -> None:
    """Take decisions away from the local store, as a restore from an older backup."""
    home = tmp_path / "store" / "job"
    for epoch in epochs:
        for path in home.rglob(f"{epoch:012d}*"):
            path.unlink()
    (home / "latest").unlink(missing_ok=True)


# -- losses found ------------------------------------------------------------------------------
def test_a_sink_that_lost_the_newest_epochs_stops_the_next_start(tmp_path: Path) -> None:
    run(job(tmp_path), 0, 1, 2)
    lose(tmp_path, "b", 1, 2)
    with pytest.raises(CommittedEpochLostError, match="holds epochs up to 0 only") as raised:
        job(tmp_path)
    error = raised.value
    assert (error.sink, error.holder, error.first_lost, error.last_lost) == ("b", "b", 1, 2)
    assert "asynchronous standby" in error.message
    assert "repair-epochs" in (error.fix or "")
    assert "reliability.md#lost-committed-epochs" in (error.fix or "")
    assert not error.retriable
    assert isinstance(error, ParticipantLostError)
    again = pickle.loads(pickle.dumps(error))  # noqa: S301 - crosses Spark's processes
    assert (again.first_lost, again.last_lost, again.holder) == (1, 2, "b")


def test_a_sink_emptied_after_the_job_committed_into_it_stops_the_next_start(
    tmp_path: Path,
) -> None:
    """Its target keeps its commit record, so showing none means it lost every epoch."""
    run(job(tmp_path), 0, 1, 2)
    shutil.rmtree(tmp_path / "b")
    with pytest.raises(CommittedEpochLostError, match="shows no committed epoch at all") as raised:
        job(tmp_path)
    error = raised.value
    assert (error.sink, error.holder, error.first_lost, error.last_lost) == ("b", "b", 0, 2)
    assert "new job_id" in (error.fix or "")
    assert not (tmp_path / "b" / "epoch=3").exists()


def test_a_store_that_lost_its_newest_decisions_stops_the_next_start(tmp_path: Path) -> None:
    run(job(tmp_path), 0, 1, 2)
    forget_decisions(tmp_path, 2)
    with pytest.raises(CommittedEpochLostError, match="lost the decisions of epoch 2") as raised:
        job(tmp_path)
    assert (raised.value.holder, raised.value.first_lost, raised.value.last_lost) == (
        "decision store",
        2,
        2,
    )


def test_a_checkpoint_past_the_newest_decision_stops_the_first_epoch(tmp_path: Path) -> None:
    run(job(tmp_path), 0, 1)
    # Both sinks and the store lost epochs 2 and 3 together (one server keeps all three);
    # only Spark's checkpoint remembers them: it asks for epoch 4.
    restarted = job(tmp_path)
    with pytest.raises(CommittedEpochLostError, match="Spark asks for epoch 4") as raised:
        restarted.run_epoch(4, rows(4))
    assert (raised.value.first_lost, raised.value.last_lost) == (2, 3)
    assert raised.value.holder == "decision store"
    with pytest.raises(CommittedEpochLostError):  # asked again: found again
        restarted.run_epoch(4, rows(4))
    assert not (tmp_path / "a" / "epoch=4").exists()


def test_a_commit_point_that_lost_its_newest_epoch_stops_the_next_start(tmp_path: Path) -> None:
    """Kafka as the last resource (a journal sink here): the store caches its decisions."""

    def journal_job() -> Coordinator:
        made = Coordinator(
            "job",
            [files(tmp_path, "a"), JournalSink(tmp_path / "journal")],
            LocalDirectoryStore(tmp_path / "store"),
        )
        made.start()
        return made

    run(journal_job(), 0, 1)
    for segment in (tmp_path / "journal").glob("*/*/000000000001.arrow"):
        segment.unlink()
    with pytest.raises(CommittedEpochLostError, match="'journal' holds epochs up to 0"):
        journal_job()


def test_executor_mode_finds_a_lost_part_of_the_newest_epoch(tmp_path: Path) -> None:
    def distributed() -> Coordinator:
        return job(tmp_path, "a", executor_mode=True)

    def parts(generation: int, epoch: int) -> list[CommitHandle]:
        return prepare_part(
            "job", generation, epoch, "0", lambda: [files(tmp_path, "a")], rows(epoch)
        )

    first = distributed()
    for epoch in (0, 1):
        first.run_distributed_epoch(epoch, lambda g, e=epoch: parts(g, e))  # type: ignore[misc]
    first.close()
    run_again = distributed()  # a legitimate restart
    run_again.run_distributed_epoch(2, lambda g: parts(g, 2))
    run_again.close()
    lose(tmp_path, "a", 2)
    with pytest.raises(CommittedEpochLostError, match="epoch 2 of the sink"):
        distributed()


# -- legitimate histories ----------------------------------------------------------------------
def test_a_zombie_finishing_its_epoch_during_the_start_is_no_loss(tmp_path: Path) -> None:
    """A driver presumed dead (A) commits its decided epoch into sink b after its successor
    (B) opened b and before B's recovery lists b's leftovers: what b showed at open is
    behind the target. B reads b again before it reports a loss, and finds the epoch."""
    run(job(tmp_path), 0)
    zombie = job(tmp_path)
    steps = zombie.epoch_steps(1, rows(1))
    for step in steps:
        if step == "after-commit:a":
            break
    successor = Coordinator(
        "job", [files(tmp_path, n) for n in "ab"], LocalDirectoryStore(tmp_path / "store")
    )
    starting = successor.start_steps()
    for step in starting:
        if step == "recovery:after-open:b":
            break
    for _ in steps:  # A commits b and marks the epoch finished
        pass
    for _ in starting:  # before: CommittedEpochLostError, sink 'b' "holds epochs up to 0"
        pass
    assert successor.run_epoch(1, rows(1)).outcome is EpochOutcome.ALREADY_COMMITTED
    run(successor, 2)
    for sink in "ab":
        assert sorted(p.name for p in (tmp_path / sink).glob("epoch=*")) == [
            "epoch=0",
            "epoch=1",
            "epoch=2",
        ]


def test_restarts_replays_and_a_fresh_job_pass(tmp_path: Path) -> None:
    run(job(tmp_path), 0, 1)  # a fresh job: no decision yet
    again = job(tmp_path)
    # Spark replays the last batch (its commit log lacked it), then goes on.
    assert again.run_epoch(1, rows(1)).outcome is EpochOutcome.ALREADY_COMMITTED
    run(again, 2)
    run(job(tmp_path), 3)


def test_expired_decisions_keep_the_newest_so_restarts_pass(tmp_path: Path) -> None:
    run(job(tmp_path, retain_epochs=1), 0, 1, 2, 3)
    assert job(tmp_path).lost_epochs.newest == 3
    run(job(tmp_path, retain_epochs=1), 4)


def test_a_sink_left_out_of_the_newest_epoch_is_not_asked_for_it(tmp_path: Path) -> None:
    """The dead-letter sink takes part only in epochs with dead letters."""

    def with_dead_letters() -> Coordinator:
        made = Coordinator(
            "job",
            [RefusingFileSink(Files(str(tmp_path / "t"), name="t"))],
            LocalDirectoryStore(tmp_path / "store"),
            policy=WritePolicy(BadRowPolicy.DEAD_LETTER),
            dead_letter=files(tmp_path, "dl"),
            bad_row_cap=BadRowCap(0.9),
        )
        made.start()
        return made

    first = with_dead_letters()
    first.run_epoch(0, rows(0, 1, -2))  # a dead letter: "dl" takes part
    first.run_epoch(1, rows(1, 1, 2))  # none: "dl" holds epoch 0 only
    first.close()
    restarted = with_dead_letters()
    assert restarted.run_epoch(2, rows(2, 3)).outcome is EpochOutcome.COMMITTED


def test_a_sink_the_newest_epoch_gave_no_rows_is_not_asked_for_it(tmp_path: Path) -> None:
    """Some targets record no commit of an empty epoch (a Delta merge of no rows)."""
    first = job(tmp_path)
    first.run_epoch(0, rows(0))
    first.run_epoch(1, [])
    first.close()
    lose(tmp_path, "b", 1)
    job(tmp_path).run_epoch(2, rows(2))


def test_an_undecided_newest_epoch_is_left_to_its_replay(tmp_path: Path) -> None:
    """Decided, not finished, its prepared participant lost: the start lets it pass, and the
    epoch's replay (which Spark runs: its commit log lacks it) fails on the lost participant;
    the finished epoch before it is checked at start instead."""
    run(job(tmp_path), 0, 1)
    crashing = job(tmp_path)
    for step in crashing.epoch_steps(2, rows(2)):
        if step == "after-decision":
            break  # the driver dies: epoch 2 decided, nothing committed
    for staging in (tmp_path / "b" / STAGING).iterdir():
        shutil.rmtree(staging)  # its prepared participant is lost
    restarted = job(tmp_path)
    with pytest.raises(ParticipantLostError) as raised:
        restarted.run_epoch(2, rows(2))
    assert not isinstance(raised.value, CommittedEpochLostError)  # the live path's own
    restarted.close()
    lose(tmp_path, "b", 1)  # the finished epoch before it is lost too: the start finds that
    with pytest.raises(CommittedEpochLostError, match="committed epoch 1 into it"):
        job(tmp_path)


class Forgetful(FolderSink):
    """A files sink that says its target may drop its commit record (as a Delta table whose
    transaction identifiers expire does)."""

    KEEPS_COMMIT_RECORD = False


@pytest.mark.parametrize("case", ["at_least_once", "no-recovery", "nothing-held"])
def test_losses_are_not_looked_for_where_nothing_can_tell(tmp_path: Path, case: str) -> None:
    run(job(tmp_path), 0, 1)
    if case == "at_least_once":
        lose(tmp_path, "b", 1)
        restarted = job(tmp_path, guarantee=DeliveryGuarantee.AT_LEAST_ONCE)
        assert restarted.run_epoch(5, rows(5)).outcome is EpochOutcome.COMMITTED
    elif case == "no-recovery":
        lose(tmp_path, "b", 1)
        job(tmp_path, recover=False)  # a look at a running job: epochs may be in flight
    else:
        # A sink that shows no epoch at all and whose target may drop its commit record.
        lose(tmp_path, "b", 0, 1)
        forgetful = Coordinator(
            "job",
            [files(tmp_path, "a"), Forgetful(Files(str(tmp_path / "b"), name="b"))],
            LocalDirectoryStore(tmp_path / "store"),
        )
        forgetful.start()
        assert forgetful.run_epoch(2, rows(2)).outcome is EpochOutcome.COMMITTED


def test_a_new_store_is_still_an_order_error_at_the_first_epoch(tmp_path: Path) -> None:
    run(job(tmp_path), 0, 1)
    shutil.rmtree(tmp_path / "store")
    restarted = job(tmp_path)  # no decision at all: not a loss the start can tell
    with pytest.raises(EpochOrderError, match="already holds epoch 1"):
        restarted.run_epoch(1, rows(1))


def test_repair_epochs_needs_one_way_and_a_sink_kind_that_can(tmp_path: Path) -> None:
    run(job(tmp_path, "a"), 0)
    args = [
        "repair-epochs",
        "job",
        "--kind",
        "files",
        "-o",
        f"path={tmp_path / 'a'}",
        "-o",
        "name=a",
    ]
    args += ["--store", str(tmp_path / "store")]
    both = CliRunner().invoke(main, [*args, "--sink", "a", "--from", "x", "--record-loss"])
    assert both.exit_code == 2, both.output
    assert "give either --from SOURCE, or --record-loss with --through EPOCH" in both.output
    files_sink = CliRunner().invoke(main, [*args, "--sink", "a", "--from", "elsewhere"])
    assert files_sink.exit_code == 1, files_sink.output
    assert "has no repair of lost epochs" in files_sink.output
    unknown = CliRunner().invoke(main, [*args, "--sink", "nope", "--record-loss", "--through", "3"])
    assert unknown.exit_code == 1, unknown.output
    assert "the job has no sink 'nope'" in unknown.output
