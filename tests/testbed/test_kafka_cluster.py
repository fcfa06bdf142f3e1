"""The three-broker Kafka cluster (`kafka-cluster`): it comes up replicated (three replicas,
min ISR 2, for data and transaction state); a killed node's leaderships move to the others,
transactions go on with one node down, and the node comes back into every ISR; the lookups
(`leader_of`, `coordinator_of`, `controller`) name the node the brokers themselves name.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from tests.services import DEFAULT_UP, NAMES, KafkaCluster, Layout, Testbed
from tests.services.kafka_cluster import (
    TRANSACTION_STATE_TOPIC,
    java_string_hash,
    transaction_state_partition,
)
from tests.testbed.test_lifecycle import _all_ports, _private_layout

#: A node's leaderships move once the others have fenced it (session 3 s) and re-elected.
MOVED_WITHIN_S = 20.0


def test_ports_are_its_own_and_only_its_fixture_starts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its six ports are wanted by no other server of the shared bed or the private beds
    (+200), whose Kafka and faults bed may run beside it; DS_KAFKA_CLUSTER_PORT moves them
    all. `up` without names leaves it alone; down/status/reset cover it."""
    shared = Layout.from_env()
    others = _all_ports(shared) + _all_ports(_private_layout(shared.root / "private"))
    mine = list(shared.kafka_cluster.all().values())
    assert len(set(mine)) == len(mine) == 6
    assert sorted(set(mine) & set(others)) == []
    assert "kafka-cluster" in NAMES
    assert "kafka-cluster" not in DEFAULT_UP
    testbed = Testbed.create()
    assert testbed.select(["kafka-cluster"]) == [testbed.kafka_cluster]

    monkeypatch.setenv("DS_KAFKA_CLUSTER_PORT", "29000")
    moved = Layout.from_env().kafka_cluster
    assert moved.all() == {
        "node-1.broker": 29000,
        "node-1.controller": 29001,
        "node-2.broker": 29002,
        "node-2.controller": 29003,
        "node-3.broker": 29004,
        "node-3.controller": 29005,
    }


def test_the_transaction_state_partition_follows_javas_string_hash() -> None:
    """Java's String.hashCode, overflow included (values from `java`); Kafka's Utils.abs
    takes the absolute value of a negative hash and maps Integer.MIN_VALUE (whose Math.abs
    stays negative) to 0."""
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("é") == 233  # one UTF-16 unit
    assert java_string_hash("job_test_the_coordinator_found_is__2dd0870125") == -1080901392
    assert java_string_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE
    assert transaction_state_partition("polygenelubricants", 50) == 0
    assert transaction_state_partition("hello", 50) == 99162322 % 50
    # the coordinator's log: "Initialized transactionalId job_test_the_coordinator_found_is_
    # _2dd0870125 ... on partition __transaction_state-2" (10 partitions); & 0x7fffffff gives 6
    assert transaction_state_partition("job_test_the_coordinator_found_is__2dd0870125", 10) == 2


def wait_for(what: str, check: Callable[[], bool], timeout: float = MOVED_WITHIN_S) -> float:
    """Poll `check` until true; return the seconds it took, fail naming `what`."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"{what} within {timeout:g} s"
        time.sleep(0.3)
    return time.monotonic() - started


def commit_one(cluster: KafkaCluster, topic: str, transactional_id: str) -> None:
    """One transaction of one record, committed (acks=all, so min ISR 2 must hold)."""
    producer = Producer(
        cluster.endpoint().config(
            {"transactional.id": transactional_id, "transaction.timeout.ms": 30_000}
        )
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"one", partition=0)
    producer.commit_transaction(30)


@pytest.mark.replicated_tier
def test_it_comes_up_with_three_replicas_and_min_isr_two(
    kafka_cluster: KafkaCluster, cluster_topic: str
) -> None:
    assert kafka_cluster.running() == [1, 2, 3]
    metadata = AdminClient(kafka_cluster.endpoint().config()).list_topics(timeout=10)
    assert sorted(metadata.brokers) == [1, 2, 3]
    for topic in (cluster_topic, TRANSACTION_STATE_TOPIC):
        for partition in metadata.topics[topic].partitions.values():
            assert sorted(partition.replicas) == [1, 2, 3], (topic, partition.id)
            assert sorted(partition.isrs) == [1, 2, 3], (topic, partition.id)
    admin = AdminClient(kafka_cluster.endpoint().config())
    for topic in (cluster_topic, TRANSACTION_STATE_TOPIC):
        resource = ConfigResource(ResourceType.TOPIC, topic)
        configs = admin.describe_configs([resource])[resource].result(timeout=10)
        assert configs["min.insync.replicas"].value == "2", topic


@pytest.mark.replicated_tier
def test_a_killed_leader_hands_over_and_comes_back_into_every_isr(
    kafka_cluster: KafkaCluster, cluster_topic: str, job_id: str
) -> None:
    leader = kafka_cluster.leader_of(cluster_topic, 0)
    kafka_cluster.kill(leader)
    assert leader not in kafka_cluster.running()
    moved = wait_for(
        f"partition 0's leadership to leave the killed node {leader}",
        lambda: kafka_cluster.leader_of(cluster_topic, 0) != leader,
    )
    commit_one(kafka_cluster, cluster_topic, job_id)  # two nodes left: min ISR 2 holds
    back = kafka_cluster.start(leader)
    print(f"leadership moved {moved:.1f} s after the kill; node {leader} back in {back:.1f} s")
    metadata = AdminClient(kafka_cluster.endpoint().config()).list_topics(timeout=10)
    for partition in metadata.topics[cluster_topic].partitions.values():
        assert leader in partition.isrs


@pytest.mark.replicated_tier
def test_the_coordinator_found_is_the_one_the_brokers_name(
    kafka_cluster: KafkaCluster, cluster_topic: str, job_id: str
) -> None:
    """`coordinator_of` agrees with DescribeTransactions' coordinator id, before and after
    the coordinator's node is killed (its `__transaction_state` partition changes leader)."""

    def described() -> int:
        found = [t for t in kafka_cluster.transactions() if t.transactional_id == job_id]
        assert len(found) == 1, found
        return found[0].coordinator_id

    commit_one(kafka_cluster, cluster_topic, job_id)
    coordinator = kafka_cluster.coordinator_of(job_id)
    assert described() == coordinator
    kafka_cluster.kill(coordinator)
    wait_for(
        f"the coordinator of {job_id!r} to leave the killed node {coordinator}",
        lambda: kafka_cluster.coordinator_of(job_id) != coordinator,
    )
    commit_one(kafka_cluster, cluster_topic, job_id)
    assert described() == kafka_cluster.coordinator_of(job_id) != coordinator


@pytest.mark.replicated_tier
def test_the_controller_is_the_quorum_leader_and_moves_when_killed(
    kafka_cluster: KafkaCluster,
) -> None:
    controller = kafka_cluster.controller()
    assert controller in (1, 2, 3)
    kafka_cluster.kill(controller)
    moved = wait_for(
        f"a new quorum leader after killing controller {controller}",
        lambda: kafka_cluster.controller() not in (controller, -1),
    )
    print(f"controller {controller} killed: a new one named {moved:.1f} s later")
    assert kafka_cluster.controller() in kafka_cluster.running()
