"""The soak's faults on the replicated servers: a three-broker Kafka cluster (RF 3, min ISR 2)
and a Postgres primary with a synchronous standby.

- SIGKILL of the broker that leads the job's topic partition, of the one whose
  `__transaction_state` partition coordinates the job's transactional id, and of the active
  KRaft controller (whichever node that is at the moment; the line says when it holds another
  of these roles too); the node starts again 2-8 s later and the fault ends when it is back in
  every partition's ISR.
- A rolling restart of the three brokers, one at a time, each back in every ISR before the
  next (controlled shutdowns or SIGKILLs).
- The Postgres primary stopped (`-m immediate` or `-m fast`) and started 2-8 s later.
- A failover: the primary killed, the synchronous standby promoted (the job's multi-host
  conninfo finds it), then a new synchronous standby built from the new primary, so that the
  next failover has one. The job's data is never reset: the old primary's folder becomes the
  new standby's.

Each is one call that returns what it did and when it struck (`Injected`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal, Protocol

from tests.soak.faults import Fault, Injected, Target, job_kinds

StopMode = Literal["immediate", "fast"]


class KafkaNodes(Protocol):
    """The three-broker cluster's controls the soak uses (tests/services/kafka_cluster.py)."""

    def kill(self, node: int) -> None: ...

    def start(self, node: int) -> float:
        """Start `node`; seconds until it is back in the ISR of every partition."""
        ...

    def leader_of(self, topic: str, partition: int) -> int: ...

    def coordinator_of(self, transactional_id: str) -> int: ...

    def controller(self) -> int: ...

    def rolling_restart(self, *, kill: bool) -> dict[int, float]:
        """Restart every node in turn, each back in every ISR before the next; each node's
        seconds from its stop until the cluster was healthy again."""
        ...


class Server(Protocol):
    def stop(self, mode: StopMode) -> None: ...

    def start(self) -> None: ...


class PostgresPair(Protocol):
    """The primary + synchronous standby's controls the soak uses
    (tests/services/postgres_standby.py)."""

    @property
    def primary(self) -> Server: ...

    def fail_over(self) -> float:
        """Kill the primary, promote the standby; seconds until the new primary accepts
        writes."""
        ...

    def rebuild_standby(self) -> None:
        """A new standby of the current primary in the old primary's folder, streaming."""
        ...


@dataclass
class Replicated:
    """What the replicated faults act on: the servers, and the job's names on them."""

    kafka: KafkaNodes
    postgres: PostgresPair
    topic: str  # the job's topic (one partition)
    transactional_id: str  # the job's Kafka producer's
    rng: random.Random
    sleep: Callable[[float], None] = time.sleep  # while a node or server is down

    def holders(self) -> dict[str, int]:
        """The node holding each role the soak kills by, now."""
        return {
            "the partition leader": self.kafka.leader_of(self.topic, 0),
            "the transaction coordinator": self.kafka.coordinator_of(self.transactional_id),
            "the controller": self.kafka.controller(),
        }


#: The roles a broker kill picks its node by, and the kind's name in the verdict table.
ROLES = {
    "the partition leader": "kill the partition leader",
    "the transaction coordinator": "kill the transaction coordinator",
    "the controller": "kill the controller",
}


def kill_broker(servers: Replicated, role: str) -> Injected:
    """SIGKILL of the broker holding `role` now; started again 2-8 s later."""
    holders = servers.holders()
    node = holders[role]
    also = [other for other, holder in holders.items() if holder == node and other != role]
    down = round(servers.rng.uniform(2, 8), 1)
    at = time.time()
    servers.kafka.kill(node)
    servers.sleep(down)
    back = servers.kafka.start(node)
    holds = f"{role}; also {' and '.join(also)}" if also else role
    return Injected(
        f"SIGKILL of broker {node} ({holds}), started {down} s later, "
        f"back in every ISR {back:.1f} s after",
        at,
    )


def rolling_restart(servers: Replicated) -> Injected:
    kill = servers.rng.random() < 0.5
    at = time.time()
    took = servers.kafka.rolling_restart(kill=kill)
    how = "SIGKILL" if kill else "controlled shutdown"
    each = ", ".join(f"{node} {seconds:.1f} s" for node, seconds in took.items())
    return Injected(
        f"rolling restart of the brokers ({how} each; stop to every ISR full: {each})", at
    )


def restart_primary(servers: Replicated) -> Injected:
    mode: StopMode = servers.rng.choice(["immediate", "fast"])
    down = round(servers.rng.uniform(2, 8), 1)
    primary = servers.postgres.primary
    at = time.time()
    primary.stop(mode)
    servers.sleep(down)
    primary.start()
    return Injected(f"Postgres primary stopped (-m {mode}), started {down} s later", at)


def fail_over(servers: Replicated) -> Injected:
    at = time.time()
    promoted = servers.postgres.fail_over()
    servers.postgres.rebuild_standby()
    rebuilt = time.time() - at - promoted
    return Injected(
        f"Postgres failover: primary killed, standby promoted and taking writes "
        f"{promoted:.1f} s later; a new synchronous standby streaming {rebuilt:.1f} s after",
        at,
    )


def replicated_kinds(target: Target, servers: Replicated, *, kafka: bool) -> dict[str, Fault]:
    """The faults of a run on the replicated servers: the job's, and those above (the Kafka
    ones only when the job writes Kafka: `kafka`)."""
    kinds: dict[str, Fault] = {**job_kinds(target)}
    if kafka:
        for role, name in ROLES.items():
            kinds[name] = partial(kill_broker, servers, role)
        kinds["rolling restart of the brokers"] = partial(rolling_restart, servers)
    kinds["restart the Postgres primary"] = partial(restart_primary, servers)
    kinds["Postgres failover"] = partial(fail_over, servers)
    return kinds
