"""A three-broker Apache Kafka cluster: three KRaft nodes (ids 1-3), each broker and controller
in one JVM, the same jars and `Kafka` class as the single-node servers, on their own ports and
folders (`.services/kafka-cluster/node-<i>/`), formatted with one cluster id.

Replicated like a production cluster: every topic (data, consumer offsets, transaction state)
has three replicas and min ISR 2, so one node may be down and writes with acks=all (every
transactional producer's) still succeed; two down and they are refused (NOT_ENOUGH_REPLICAS).
A node whose heartbeats stop is fenced after 3 s (`broker.session.timeout.ms`; the default 9 s
stalls a transactional commit 10-13 s after a SIGKILL, 3 s stalls it 4-6 s).

On demand: only its fixture (`kafka_cluster`, tests/conftest.py) or
`python -m tests.services up kafka-cluster` starts it. Fault tests use the controls:
`kill(node)`, `stop(node)`, `start(node)`, `rolling_restart()`, and the lookups `leader_of`,
`coordinator_of`, `controller`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ._layout import Layout
from ._process import ServiceError, wait_until
from ._service import Status, remove_tree
from ._steps import publish_file
from .endpoints import KafkaEndpoint
from .kafka import Kafka, KafkaTransaction, new_cluster_id

NAME = "kafka-cluster"
NODE_IDS = (1, 2, 3)
#: Each node's JVM heap (three share a 2-core machine with Spark): ~330 MB resident each.
HEAP = "320m"
START_TIMEOUT = 180.0
#: The internal topic whose partition leaders are the transaction coordinators.
TRANSACTION_STATE_TOPIC = "__transaction_state"
_QUORUM_JAVA = Path(__file__).resolve().parent / "java" / "KafkaQuorum.java"

#: Over the single node's settings (tests/services/kafka.py): three replicas, min ISR 2, for
#: data and every internal topic; a short broker session (a dead node fenced, and its
#: partitions' leadership moved, within ~3 s); aborts of timed-out transactions looked for
#: every second.
SETTINGS = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "num.io.threads": "2",
}


def java_string_hash(text: str) -> int:
    """Java's `String.hashCode()` of `text` (over UTF-16 code units, signed 32-bit
    overflow)."""
    encoded = text.encode("utf-16-be")
    value = 0
    for i in range(0, len(encoded), 2):
        value = (31 * value + int.from_bytes(encoded[i : i + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def transaction_state_partition(transactional_id: str, partitions: int) -> int:
    """The `__transaction_state` partition holding `transactional_id`'s state: Kafka's
    `Utils.abs(id.hashCode()) % partitions` (TransactionStateManager.partitionFor), where
    Utils.abs is the absolute value, and 0 for Integer.MIN_VALUE; not `& 0x7fffffff`, which
    names another partition for every negative hash (seen: the coordinator's own log names
    the partition it initialised an id on)."""
    hashed = java_string_hash(transactional_id)
    return (0 if hashed == -(1 << 31) else abs(hashed)) % partitions


class KafkaCluster:
    """The three nodes of `kafka-cluster` and what tests do to them (see the module docs).

    `up` is idempotent and starts whatever node is not running; it returns once every node is
    registered, every partition's ISR is full and a probe transaction committed."""

    def __init__(self, layout: Layout) -> None:
        self.name = NAME
        self.layout = layout
        self.home = layout.service_dir(NAME)
        ports = layout.kafka_cluster
        voters = {node: ports.node(node).controller for node in NODE_IDS}
        self.nodes: dict[int, Kafka] = {
            node: Kafka(
                layout,
                name=f"{NAME}-{node}",
                settings=SETTINGS,
                ports=ports.node(node),
                home=self.home / f"node-{node}",
                node_id=node,
                voters=voters,
                cluster_id=self._cluster_id,
                heap=HEAP,
            )
            for node in NODE_IDS
        }
        #: One start of a node at a time in this process (a test's delayed restart and the
        #: fixture's `up` may race: two JVMs of one node would both run).
        self._starting = {node: threading.Lock() for node in NODE_IDS}

    def _cluster_id(self) -> str:
        """The id every node is formatted with: made once, kept in the cluster's folder."""
        return publish_file(self.home / "cluster-id", new_cluster_id()).strip()

    # -- the service -------------------------------------------------------------------------
    def endpoint(self) -> KafkaEndpoint:
        """Bootstrap servers of all three nodes (a client reaches the cluster through any)."""
        return KafkaEndpoint(
            ",".join(node.endpoint().bootstrap_servers for node in self.nodes.values())
        )

    def ports(self) -> dict[str, int]:
        return self.layout.kafka_cluster.all()

    def up(self) -> None:
        """Start every node that is not running (together: a lone node has no quorum), then
        wait until the cluster is healthy (`wait_healthy`)."""
        self._each(self._start_node, [n for n in NODE_IDS if self.nodes[n].pid() is None])
        self.wait_healthy()

    def down(self) -> None:
        self._each(lambda node: self.nodes[node].down(), list(NODE_IDS))

    def reset(self) -> None:
        self.down()
        remove_tree(self.home)

    def status(self) -> Status:
        running = {node: self.nodes[node].pid() for node in NODE_IDS}
        detail = f"bootstrap {self.endpoint().bootstrap_servers}; " + ", ".join(
            f"node {node}: " + (f"pid {pid}" if pid is not None else "down")
            for node, pid in running.items()
        )
        pids = [pid for pid in running.values() if pid is not None]
        if pids:
            detail += " (answering)" if self.ready() else " (NOT answering)"
        logs = tuple(log for node in self.nodes.values() for log in node.log_files())
        return Status(self.name, bool(pids), pids[0] if pids else None, detail, logs)

    def ready(self) -> bool:
        """Every node answers and the cluster lists all three."""
        return all(node.ready() for node in self.nodes.values())

    # -- controls ----------------------------------------------------------------------------
    def kill(self, node: int) -> None:
        """SIGKILL node `node`'s JVM (a crash: no controlled shutdown, nothing flushed);
        returns once it is gone. The others fence it ~3 s later."""
        self.nodes[node].kill()

    def stop(self, node: int) -> None:
        """Controlled shutdown of node `node` (SIGTERM: it hands its leaderships over and
        leaves the ISRs first); returns once it has exited."""
        self.nodes[node].down()

    def start(self, node: int, timeout: float = START_TIMEOUT) -> float:
        """Start node `node` again and wait until the cluster is healthy (the node back in
        the ISR of every partition); return the seconds from this call until then."""
        started = time.monotonic()
        self._start_node(node)
        self.wait_healthy(timeout)
        return time.monotonic() - started

    def rolling_restart(
        self,
        *,
        kill: bool = False,
        between: Callable[[int], object] | None = None,
        timeout: float = START_TIMEOUT,
    ) -> dict[int, float]:
        """Restart the nodes one at a time, each stopped (or, with `kill`, SIGKILLed) and
        started again, waiting for every ISR to be full before the next; `between(node)` runs
        while that node is down. Returns each node's seconds from being stopped until the
        cluster was healthy again."""
        took: dict[int, float] = {}
        for node in NODE_IDS:
            went = time.monotonic()
            if kill:
                self.kill(node)
            else:
                self.stop(node)
            if between is not None:
                between(node)
            self.start(node, timeout)
            took[node] = time.monotonic() - went
        return took

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> float:
        """Block until every node runs and is registered, every partition of every topic has
        all its replicas in its ISR, and a probe transaction commits; return the seconds
        waited. Raise ServiceError naming what is still missing after `timeout`."""
        started = time.monotonic()
        missing: list[str] = []

        def healthy() -> bool:
            missing[:] = self._unhealthy()
            return not missing

        try:
            wait_until(self.name, healthy, timeout=timeout, what="every node and every ISR full")
        except ServiceError:
            raise ServiceError(
                self.name,
                f"not healthy within {timeout:.0f} s: {'; '.join(missing)}",
                log=self._log_of_first_missing(missing),
            ) from None
        left = max(timeout - (time.monotonic() - started), 10.0)
        self._running_node().wait_transactions_ready(left)
        return time.monotonic() - started

    def _unhealthy(self) -> list[str]:
        """What keeps the cluster from being healthy, in words (empty: nothing)."""
        down = [f"node {n} not running" for n in NODE_IDS if self.nodes[n].pid() is None]
        if down:
            return down
        try:
            metadata = self._metadata()
        except ServiceError as exc:
            return [exc.problem]
        problems = [f"node {n} not registered" for n in NODE_IDS if n not in metadata.brokers]
        for topic in metadata.topics.values():
            for partition in topic.partitions.values():
                if sorted(partition.isrs) != sorted(partition.replicas):
                    problems.append(
                        f"{topic.topic}-{partition.id} ISR {sorted(partition.isrs)} of "
                        f"replicas {sorted(partition.replicas)}"
                    )
        return problems[:5]

    def _log_of_first_missing(self, missing: list[str]) -> Path | None:
        for node in NODE_IDS:
            if any(problem.startswith(f"node {node} ") for problem in missing):
                return self.nodes[node].logs / "server.log"
        return None

    def create_topic(self, topic: str, partitions: int = 3, timeout: float = 60.0) -> None:
        """Create `topic` with `partitions` partitions of three replicas each, and return once
        every running node's metadata has it with a leader and a full ISR for each (a topic
        just created is not yet known to every node)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.endpoint().config())
        made = admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=len(NODE_IDS))],
            request_timeout=30,
        )
        made[topic].result(timeout=30)

        def known_everywhere() -> bool:
            for node in self.running():
                view = self._metadata(self.nodes[node].endpoint()).topics.get(topic)
                if view is None or len(view.partitions) != partitions:
                    return False
                if any(
                    p.leader not in self.nodes or sorted(p.isrs) != sorted(p.replicas)
                    for p in view.partitions.values()
                ):
                    return False
            return True

        wait_until(
            self.name, known_everywhere, timeout=timeout, what=f"every node to know {topic!r}"
        )

    # -- lookups -------------------------------------------------------------------------------
    def leader_of(self, topic: str, partition: int) -> int:
        """The node that leads `topic`'s partition `partition` now."""
        metadata = self._metadata()
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or partition not in found.partitions:
            raise ServiceError(self.name, f"no partition {partition} of topic {topic!r}")
        leader = int(found.partitions[partition].leader)
        if leader not in self.nodes:
            raise ServiceError(self.name, f"{topic}-{partition} has no leader now ({leader})")
        return leader

    def coordinator_of(self, transactional_id: str) -> int:
        """The node that is `transactional_id`'s transaction coordinator now: the leader of
        its `__transaction_state` partition (`transaction_state_partition`)."""
        metadata = self._metadata()
        state = metadata.topics.get(TRANSACTION_STATE_TOPIC)
        if state is None or not state.partitions:
            raise ServiceError(
                self.name, f"no {TRANSACTION_STATE_TOPIC} topic yet: no transaction ever ran"
            )
        partition = transaction_state_partition(transactional_id, len(state.partitions))
        return self.leader_of(TRANSACTION_STATE_TOPIC, partition)

    def controller(self) -> int:
        """The active KRaft controller: the metadata quorum's leader, by DescribeMetadataQuorum
        (java/KafkaQuorum.java, ~2-3 s)."""
        node = self._running_node()
        out = node.admin_tool(_QUORUM_JAVA, self.endpoint().bootstrap_servers).split()
        if not out:
            raise ServiceError(self.name, "DescribeMetadataQuorum printed nothing")
        return int(out[0])

    def transactions(self) -> list[KafkaTransaction]:
        """Every transactional id the cluster knows, with its state and coordinator."""
        return self._running_node().transactions()

    def open_transactions(self) -> list[KafkaTransaction]:
        """The cluster's transactions still open (neither committed nor aborted)."""
        return [t for t in self.transactions() if t.open]

    def running(self) -> list[int]:
        """The nodes whose JVM runs."""
        return [node for node in NODE_IDS if self.nodes[node].pid() is not None]

    # -- inside ----------------------------------------------------------------------------------
    def _metadata(self, endpoint: KafkaEndpoint | None = None) -> Any:
        """The cluster's metadata (brokers that are registered and not fenced, topics with
        their partitions' leader, replicas and ISR) from any running node, or from the one at
        `endpoint`."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(
            (endpoint or self.endpoint()).config(
                {"socket.connection.setup.timeout.ms": 2000, "log.connection.close": False}
            )
        )
        try:
            return admin.list_topics(timeout=5)
        except KafkaException as exc:
            raise ServiceError(self.name, f"no node answered a metadata request: {exc}") from None

    def _running_node(self) -> Kafka:
        for node in NODE_IDS:
            if self.nodes[node].pid() is not None:
                return self.nodes[node]
        raise ServiceError(self.name, "no node is running; start the cluster with `up`")

    def _start_node(self, node: int) -> None:
        """Start one node's JVM and wait until it is registered. A node killed moments ago is
        still listed (its session has not timed out) and its new incarnation is refused until
        it has: wait for the old one to be fenced first, so that `wait_healthy` afterwards
        never mistakes the dead incarnation's ISR places for the new one's."""
        with self._starting[node]:
            if self.nodes[node].pid() is not None:
                self.nodes[node].up()  # started meanwhile: wait until it answers
                return
            others = [n for n in NODE_IDS if n != node and self.nodes[n].pid() is not None]
            if others:
                wait_until(
                    self.name,
                    lambda: not self._listed(node),
                    timeout=30,
                    what=f"the cluster to fence the stopped node {node}",
                )
            self.nodes[node].up()

    def _listed(self, node: int) -> bool:
        with contextlib.suppress(ServiceError):
            return node in self._metadata().brokers
        return False

    def _each(self, action: Callable[[int], object], nodes: list[int]) -> None:
        """`action(node)` for each node at once; raise one error naming every failure."""
        if not nodes:
            return
        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            futures = {node: pool.submit(action, node) for node in nodes}
        failures = [
            f"node {node}: {future.exception()}"
            for node, future in futures.items()
            if future.exception() is not None
        ]
        if failures:
            raise ServiceError(self.name, "\n".join(failures))
