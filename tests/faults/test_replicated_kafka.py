"""Real Spark jobs (Postgres + Kafka) on the three-broker Kafka cluster ride through the loss of
a node at every protocol step of a batch, exactly once: the leader of the topic's partition 0,
the transaction coordinator of the job's transactional id, or the active KRaft controller is
SIGKILLed at the step and started again `DOWN_S` later (or left down until the batch is done:
two nodes still make min ISR 2). A rolling restart of all three nodes (controlled, then
SIGKILL) under a job of many batches: exactly once.

Each case prints `pause` lines (fault fired -> the hit batch done) that docs/reliability.md
("Replicated servers") quotes. One node may hold two roles (say the leader is also the
coordinator): the line names every role the killed node held.

Run: `DS_REPLICATED=1 .venv/bin/python -m pytest -m replicated_tier -s
tests/faults/test_replicated_kafka.py` (or `make test-replicated`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durable_sinks.sinks.kafka import writer as kafka_writer
from durable_sinks.sinks.kafka.progress import transactional_id
from tests.services import KafkaCluster, PostgresEndpoint
from tests.support.fault_bed import Later

from .jobs import HIT_EPOCH, Endpoints, Fault, FaultyWriter, Job, Trigger

pytestmark = pytest.mark.replicated_tier

#: How long a killed node stays down before it is started again.
DOWN_S = 3.0
#: The protocol steps a node is killed at. `commit-point` arms at `after-pre-commit:kafka`
#: and kills `COMMIT_KILL_DELAY_S` into the sink's commit_transaction call (see KillInCommit).
STEPS = {
    "epoch-start": "epoch-start",  # between two epochs: the next one's offset read is sent
    "before-write": "after-begin:kafka",
    "mid-write": "after-write:0:postgres",  # the Kafka transaction begun, nothing flushed
    "before-commit": "after-pre-commit:kafka",  # Postgres prepared, Kafka records acked
    "commit-point": "after-pre-commit:kafka",
    "after-decision": "after-decision",  # Kafka committed, Postgres still prepared
}
ROLES = ("leader", "coordinator", "controller")
COMMIT_KILL_DELAY_S = 0.005
#: The longest a hit batch may take from the kill until it is done: the cluster keeps
#: serving with two nodes, so the batch must not wait for the killed one to return, nor a
#: request to it wait out request_timeout_s (30 s: 30-37 s pauses before the sink capped each
#: offset read's attempt; 4-15 s since, on a loaded 2-core machine).
PAUSE_BOUND_S = 25.0
#: The rolling restarts' job: batches slowed to ~1 s each so that it outlasts three restarts
#: (each node back in every ISR 18-32 s after its stop or kill on a loaded machine: 40 batches
#: were outrun once batches no longer waited out request_timeout_s).
ROLLING_BATCHES = 120
BATCH_DELAY_S = 1.0


@dataclass
class Roles:
    """Which node holds each role for the job, found before it starts (nothing moves them
    until a node is lost)."""

    leader: int  # of the job's topic's partition 0
    coordinator: int  # of the job's transactional id
    controller: int  # the KRaft quorum's leader

    @classmethod
    def find(cls, cluster: KafkaCluster, topic: str, job_id: str) -> Roles:
        return cls(
            leader=cluster.leader_of(topic, 0),
            coordinator=cluster.coordinator_of(transactional_id(job_id, "kafka")),
            controller=cluster.controller(),
        )

    def node(self, role: str) -> int:
        node: int = getattr(self, role)
        return node

    def held_by(self, node: int) -> str:
        """Every role `node` holds, e.g. `leader+coordinator`."""
        return "+".join(role for role in ROLES if self.node(role) == node)


class KillInCommit:
    """SIGKILLs a node `COMMIT_KILL_DELAY_S` after the Kafka sink's commit_transaction call
    begins: the commit point in flight. Armed by a step trigger (`after-pre-commit:kafka`),
    it wraps `TransactionalProducer.commit` (in this process: the driver runs the
    coordinator) and fires once, from a timer thread, while the call runs."""

    def __init__(self, kill: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> None:
        self._kill = kill
        self.armed = False
        self.fired_at: float | None = None
        self.commit_returned_at: float | None = None
        original = kafka_writer.TransactionalProducer.commit

        def commit(producer: kafka_writer.TransactionalProducer, epoch: int | None = None) -> None:
            if not self.armed:
                original(producer, epoch)
                return
            self.armed = False
            timer = threading.Timer(COMMIT_KILL_DELAY_S, self._fire)
            timer.start()
            try:
                original(producer, epoch)
            finally:
                self.commit_returned_at = time.monotonic()
                timer.join()

        monkeypatch.setattr(kafka_writer.TransactionalProducer, "commit", commit)

    def arm(self) -> None:
        """Kill in the next commit (a step trigger's fault: it ends when the kill fires)."""
        self.armed = True

    def _fire(self) -> None:
        self.fired_at = time.monotonic()
        self._kill()


@pytest.fixture
def job(
    kafka_cluster: KafkaCluster,
    cluster_topic: str,
    postgres: PostgresEndpoint,
    pg_schema: str,
    spark: Any,
    job_id: str,
    tmp_path: Path,
) -> Job:
    made = Job(
        Endpoints(postgres, kafka_cluster.endpoint()),
        spark,
        pg_schema,
        cluster_topic,
        job_id,
        tmp_path,
    )
    made.write_input()
    return made


def kill_and_restart(
    cluster: KafkaCluster, node: int, down_s: float | None
) -> Callable[[], Later[float] | None]:
    """SIGKILL `node`; start it again `down_s` later (None: left down)."""

    def inject() -> Later[float] | None:
        cluster.kill(node)
        if down_s is None:
            return None
        return Later(down_s, lambda: cluster.start(node))

    return inject


def report_pause(case: str, roles: Roles, node: int, fired: float, done: float) -> float:
    pause = done - fired
    print(
        f"\npause {case}: node {node} ({roles.held_by(node)}) killed, batch done "
        f"{pause:.2f} s later"
    )
    return pause


def check_cluster_clean(cluster: KafkaCluster, job_id: str) -> None:
    """No transaction of the job is left open on the cluster."""
    mine = transactional_id(job_id, "kafka")
    assert [t for t in cluster.open_transactions() if t.transactional_id == mine] == []


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("role", ROLES)
def test_a_node_killed_at_a_step_is_ridden_through_exactly_once(
    job: Job,
    kafka_cluster: KafkaCluster,
    monkeypatch: pytest.MonkeyPatch,
    role: str,
    step: str,
) -> None:
    assert job.topic is not None
    roles = Roles.find(kafka_cluster, job.topic, job.job_id)
    node = roles.node(role)
    inject = kill_and_restart(kafka_cluster, node, DOWN_S)
    in_commit: KillInCommit | None = None
    restarted: list[Later[float] | None] = []
    if step == "commit-point":
        in_commit = KillInCommit(lambda: restarted.append(inject()), monkeypatch)
        fault = Fault(f"arm a kill of node {node} in the commit", in_commit.arm)
    else:
        fault = Fault(f"node {node} ({role}) SIGKILL", inject, fails_attempt=False)
    trigger = Trigger(HIT_EPOCH, STEPS[step], fault)
    writer = job.writer([trigger])
    try:
        job.run(writer)  # raises if the query stopped
    finally:  # the delayed restart must be over before the fixtures check the cluster
        for later in [trigger.ended, *restarted]:
            if later is not None:
                later.result()
    if in_commit is not None:
        assert in_commit.fired_at is not None, "the kill in the commit never fired"
        assert in_commit.commit_returned_at is not None
        fired = in_commit.fired_at
        trigger.ended = restarted[0]
    else:
        assert trigger.fired_at is not None, f"{fault.name} never reached {trigger.step}"
        fired = trigger.fired_at
    pause = report_pause(f"{role} {step}", roles, node, fired, writer.done_at[HIT_EPOCH])
    assert pause < PAUSE_BOUND_S
    assert trigger.ended is not None
    trigger.ended.result()
    job.check_exactly_once()
    check_cluster_clean(kafka_cluster, job.job_id)


@pytest.mark.parametrize("role", ROLES)
def test_a_node_killed_before_the_commit_and_left_down_is_ridden_through(
    job: Job, kafka_cluster: KafkaCluster, role: str
) -> None:
    """Two nodes are enough (min ISR 2): the batch and the ones after it commit while the
    killed node stays down."""
    assert job.topic is not None
    roles = Roles.find(kafka_cluster, job.topic, job.job_id)
    node = roles.node(role)
    fault = Fault(
        f"node {node} ({role}) SIGKILL, left down",
        kill_and_restart(kafka_cluster, node, None),
        fails_attempt=False,
    )
    trigger = Trigger(HIT_EPOCH, STEPS["before-commit"], fault)
    writer = job.writer([trigger])
    job.run(writer)
    assert node not in kafka_cluster.running()
    assert trigger.fired_at is not None
    pause = report_pause(
        f"{role} before-commit, left down", roles, node, trigger.fired_at, writer.done_at[HIT_EPOCH]
    )
    assert pause < PAUSE_BOUND_S
    job.check_exactly_once()
    check_cluster_clean(kafka_cluster, job.job_id)
    kafka_cluster.start(node)


@pytest.mark.parametrize("kill", [False, True], ids=["controlled", "sigkill"])
def test_a_rolling_restart_under_a_long_job_is_exactly_once(
    job: Job, kafka_cluster: KafkaCluster, kill: bool
) -> None:
    """All three nodes restarted one at a time (each back in every ISR before the next)
    while a job of many slowed batches runs; started at batch 1, done before the job is."""
    job.batches = ROLLING_BATCHES
    job.write_input()
    slow = [
        Trigger(
            epoch,
            "epoch-start",
            Fault("slow batch", lambda: time.sleep(BATCH_DELAY_S), fails_attempt=False),
        )
        for epoch in range(ROLLING_BATCHES)
    ]
    took: dict[int, float] = {}

    def restart_all() -> None:
        took.update(kafka_cluster.rolling_restart(kill=kill))

    rolling = Fault("rolling restart", lambda: Later(0.0, restart_all), fails_attempt=False)
    start = Trigger(HIT_EPOCH, "after-begin:kafka", rolling)
    writer: FaultyWriter = job.writer([start, *slow])
    job.run(writer, timeout=600)
    assert start.ended is not None
    start.ended.result()
    assert start.ended.finished_at is not None
    assert start.ended.finished_at < writer.done_at[ROLLING_BATCHES - 1], (
        "the job finished before the rolling restart did: make it longer"
    )
    durations = [
        writer.done_at[epoch] - writer.done_at[epoch - 1] - BATCH_DELAY_S
        for epoch in range(1, ROLLING_BATCHES)
    ]
    mode = "SIGKILL" if kill else "controlled"
    print(
        f"\npause rolling restart ({mode}): nodes back after "
        + ", ".join(f"{node}: {seconds:.1f} s" for node, seconds in took.items())
        + f"; slowest batch {max(durations):.2f} s beyond its delay, "
        f"median {sorted(durations)[len(durations) // 2]:.2f} s"
    )
    job.check_exactly_once()
    check_cluster_clean(kafka_cluster, job.job_id)
