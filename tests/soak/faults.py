"""The soak's four kinds of fault, each injected and undone in one call.

Every kind returns what it did (one line for the soak's log and table) or None when it could
not act right now (no driver or executor alive yet): the soak then tries another moment.
Servers are the faults bed's (never the main bed's, which tests share); the links cut are
Toxiproxy's proxies in front of the faults Postgres and Kafka, the ones the job goes through.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tests.support.fault_bed import FaultBed


class Driver(Protocol):
    """The soak's supervised driver process."""

    def kill(self) -> bool:
        """SIGKILL the driver's process group; False when none runs."""
        ...


class Cluster(Protocol):
    def executors(self) -> list[tuple[int, int]]: ...

    def kill_executor(self, pid: int) -> None: ...


@dataclass
class Target:
    """What the faults act on."""

    bed: FaultBed
    cluster: Cluster
    driver: Driver
    rng: random.Random


def kill_driver(target: Target) -> str | None:
    if not target.driver.kill():
        return None
    return "SIGKILL of the driver (Python and its JVM)"


def kill_executor(target: Target) -> str | None:
    executors = target.cluster.executors()
    if not executors:
        return None
    worker, pid = target.rng.choice(executors)
    target.cluster.kill_executor(pid)
    return f"SIGKILL of the executor on worker {worker} (pid {pid})"


def restart_server(target: Target) -> str | None:
    bed, rng = target.bed, target.rng
    down = round(rng.uniform(2, 8), 1)
    if rng.random() < 0.5:
        mode: Literal["immediate", "fast"] = rng.choice(["immediate", "fast"])
        bed.postgres_server.stop(mode)
        time.sleep(down)
        bed.postgres_server.start()
        return f"Postgres stopped (-m {mode}), started {down} s later"
    bed.kafka_server.kill()
    time.sleep(down)
    bed.kafka_server.start()
    bed.kafka_server.wait_transactions_ready()
    return f"Kafka broker SIGKILLed, started {down} s later"


def cut_link(target: Target) -> str | None:
    bed, rng = target.bed, target.rng
    name, proxy = rng.choice([("Postgres", bed.postgres_proxy), ("Kafka", bed.kafka_proxy)])
    seconds = round(rng.uniform(3, 10), 1)
    kinds: list[tuple[str, Callable[[], AbstractContextManager[Any]]]] = [
        ("refused (proxy disabled)", proxy.disabled),
        ("reset (TCP RST)", proxy.reset_peer),
        ("black-holed", proxy.black_hole),
    ]
    how, cut = rng.choice(kinds)
    with cut():
        time.sleep(seconds)
    return f"link to {name} {how} for {seconds} s"


#: The kinds, by the name the verdict table shows.
KINDS: dict[str, Callable[[Target], str | None]] = {
    "kill the driver": kill_driver,
    "kill an executor": kill_executor,
    "restart a server": restart_server,
    "cut a link": cut_link,
}


class Schedule:
    """Which kind comes next: each kind once per round, rounds shuffled, so that every kind
    is injected about as often as the others whatever the run's length."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._round: list[str] = []

    def next(self) -> str:
        if not self._round:
            self._round = list(KINDS)
            self._rng.shuffle(self._round)
        return self._round.pop()
