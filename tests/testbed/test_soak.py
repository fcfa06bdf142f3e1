"""The soak's own logic (tests/soak), without servers: its audit flags every duplicate, loss
and stray row, its schedule injects each fault kind about equally often, a fault's pause is
measured to the end of the first batch that began after it, and the replicated servers'
faults act on the node that holds the role they are named by."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from tests.soak.faults import Injected, Schedule, Target
from tests.soak.pauses import (
    Batch,
    BatchLog,
    calm_batch,
    describe,
    pause_after,
    while_starting,
)
from tests.soak.replicated import ROLES, Replicated, StopMode, kill_broker, replicated_kinds
from tests.soak.verdict import Tally, Verdict, counted


def test_every_row_once_passes_and_each_kind_of_miscount_fails() -> None:
    assert counted("S3", [2, 0, 1], 3)[0][2]
    duplicate = counted("S3", [0, 1, 1, 2], 3)[0]
    lost = counted("S3", [0, 2], 3)[0]
    stray = counted("S3", [0, 1, 2, 7], 3)[0]
    assert duplicate[1] == "4 rows; 1 duplicates, 0 lost, 0 unexpected"
    assert lost[1] == "2 rows; 0 duplicates, 1 lost, 0 unexpected"
    assert stray[1] == "4 rows; 0 duplicates, 0 lost, 1 unexpected"
    assert not duplicate[2]
    assert not lost[2]
    assert not stray[2]


def test_one_failed_check_fails_the_verdict_and_the_table_says_which() -> None:
    verdict = Verdict([("a", "1", True), ("b", "2", False)], extra={"command": "x"})
    assert not verdict.passed
    table = verdict.markdown()
    assert "| b | 2 | FAIL |" in table
    assert "| a | 1 | ok |" in table
    assert "| command | x | |" in table
    assert Verdict([("a", "1", True)]).passed


def test_the_schedule_injects_each_kind_once_per_round() -> None:
    kinds = ["kill the driver", "kill the controller", "Postgres failover"]
    schedule = Schedule(random.Random(7), kinds)
    drawn = [schedule.next() for _ in range(len(kinds) * 5)]
    assert Counter(drawn) == dict.fromkeys(kinds, 5)
    for start in range(0, len(drawn), len(kinds)):
        assert sorted(drawn[start : start + len(kinds)]) == sorted(kinds)


def test_a_pause_runs_to_the_end_of_the_first_batch_begun_after_the_fault() -> None:
    batches = [Batch(1, 10.0, 11.0), Batch(2, 12.0, 20.0), Batch(3, 21.0, 22.5)]
    assert pause_after(11.5, batches) == 8.5  # batch 2 began after and ended at 20
    assert pause_after(12.5, batches) == 10.0  # batch 2 began before: batch 3 counts
    assert pause_after(30.0, batches) is None
    assert calm_batch(batches) == 1.5
    assert describe([8.5, 10.0, None]) == "pause median 9.2 s, max 10.0 s (1 with no batch after)"
    assert describe([None]) == ""
    assert describe([], starting=1) == "1 while a driver started: no pause measured"
    assert (
        describe([2.0], starting=3)
        == "pause median 2.0 s, max 2.0 s (3 more while a driver started)"
    )


def test_a_fault_strikes_a_starting_driver_until_its_first_batch_ends() -> None:
    batches = [Batch(1, 10.0, 11.0), Batch(2, 40.0, 41.0)]
    starts = [0.0, 20.0]  # the second driver's first batch is batch 2
    assert while_starting(5.0, batches, starts)  # the first driver has finished nothing yet
    assert not while_starting(15.0, batches, starts)
    assert while_starting(30.0, batches, starts)
    assert not while_starting(45.0, batches, starts)
    assert not while_starting(5.0, batches, [])


def test_the_batch_log_keeps_what_drivers_wrote_and_skips_a_torn_line(tmp_path: Path) -> None:
    log = BatchLog(tmp_path / "batches.log")
    assert log.batches() == []
    written: list[int] = []
    log.wrap(lambda frame, epoch: written.append(epoch))(None, 4)
    with log.path.open("a") as out:
        out.write("5 100.0")  # a driver killed while writing its line
    (batch,) = log.batches()
    assert written == [4]
    assert batch.epoch == 4
    assert batch.began <= batch.ended


def test_a_kind_fails_the_verdict_below_its_minimum_and_its_row_shows_the_pauses() -> None:
    tally = Tally(kinds=["kill the controller", "Postgres failover"])
    tally.injected("kill the controller", Injected("broker 2 killed", 10.0))
    tally.injected("kill the controller", Injected("broker 1 killed", 30.0))
    tally.injected("kill the controller", Injected("broker 3 killed", 50.0))
    tally.missed("Postgres failover")
    batches = [Batch(1, 9.0, 9.5), Batch(2, 11.0, 14.0), Batch(3, 31.0, 36.0), Batch(4, 60, 61)]
    starts = [0.0, 45.0]  # the third kill struck the second driver before its first batch
    assert tally.row("kill the controller", batches, starts, 3) == (
        "fault: kill the controller",
        "3 times; pause median 5.0 s, max 6.0 s (1 more while a driver started)",
        True,
    )
    assert tally.row("Postgres failover", batches, starts, 1) == (
        "fault: Postgres failover",
        "0 times; 1 moments with nothing to act on",
        False,
    )


class Nodes:
    """Three nodes whose roles a test sets, recording what was done to which."""

    def __init__(self, leader: int, coordinator: int, controller: int) -> None:
        self.roles = {"leader": leader, "coordinator": coordinator, "controller": controller}
        self.done: list[str] = []

    def kill(self, node: int) -> None:
        self.done.append(f"kill {node}")

    def start(self, node: int) -> float:
        self.done.append(f"start {node}")
        return 1.5

    def leader_of(self, topic: str, partition: int) -> int:
        return self.roles["leader"]

    def coordinator_of(self, transactional_id: str) -> int:
        return self.roles["coordinator"]

    def controller(self) -> int:
        return self.roles["controller"]

    def rolling_restart(self, *, kill: bool) -> dict[int, float]:
        self.done.append(f"rolling kill={kill}")
        return {1: 3.0, 2: 4.0, 3: 5.0}


class Server:
    def __init__(self, done: list[str]) -> None:
        self.done = done

    def stop(self, mode: StopMode) -> None:
        self.done.append(f"stop {mode}")

    def start(self) -> None:
        self.done.append("start")


class Pair:
    def __init__(self) -> None:
        self.done: list[str] = []

    @property
    def primary(self) -> Server:
        return Server(self.done)

    def fail_over(self) -> float:
        self.done.append("fail over")
        return 0.4

    def rebuild_standby(self) -> None:
        self.done.append("rebuild")


def replicated(nodes: Nodes, pair: Pair) -> Replicated:
    return Replicated(nodes, pair, "t", "ds:job:kafka", random.Random(3), sleep=lambda _: None)


def test_a_broker_kill_restarts_the_node_holding_the_role_and_names_its_other_roles() -> None:
    nodes = Nodes(leader=2, coordinator=2, controller=3)
    servers = replicated(nodes, Pair())
    leader = kill_broker(servers, "the partition leader")
    assert nodes.done == ["kill 2", "start 2"]
    assert "broker 2 (the partition leader; also the transaction coordinator)" in leader.what
    controller = kill_broker(servers, "the controller")
    assert nodes.done[2:] == ["kill 3", "start 3"]
    assert "broker 3 (the controller)," in controller.what


class Job:
    def kill(self) -> bool:
        return True

    def executors(self) -> list[tuple[int, int]]:
        return []

    def kill_executor(self, pid: int) -> None:
        raise AssertionError("no executor to kill")


def test_the_replicated_kinds_leave_kafka_out_of_a_job_without_it_and_fail_over_then_rebuild() -> (
    None
):
    job = Job()
    target = Target(job, job, random.Random(1))
    nodes, pair = Nodes(1, 2, 3), Pair()
    with_kafka = replicated_kinds(target, replicated(nodes, pair), kafka=True)
    without = replicated_kinds(target, replicated(nodes, pair), kafka=False)
    assert set(ROLES.values()) < set(with_kafka)
    assert "rolling restart of the brokers" in with_kafka
    assert not set(ROLES.values()) & set(without)
    assert "rolling restart of the brokers" not in without
    done = without["Postgres failover"]()
    assert done is not None
    assert pair.done == ["fail over", "rebuild"]
    assert "taking writes 0.4 s later" in done.what
    restarted = with_kafka["restart the Postgres primary"]()
    assert restarted is not None
    assert pair.done[2] in {"stop immediate", "stop fast"}
    assert pair.done[3:] == ["start"]
    assert with_kafka["kill an executor"]() is None
