"""The soak's faults on the faults bed, those common to both beds, and the schedule.

Every fault is injected and undone in one call, and returns what it did (one line for the
soak's log) and when it struck (`Injected`), or None when it could not act right now (no
driver or executor alive yet): the soak then tries another moment. A kind is a function of no
argument bound to what it acts on (`Fault`); the replicated servers' kinds are in
tests/soak/replicated.py.

On the faults bed, servers are the faults bed's (never the main bed's, which tests share); the
links cut are Toxiproxy's proxies in front of the faults Postgres and Kafka, the ones the job
goes through.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Protocol

from tests.support.fault_bed import FaultBed


@dataclass(frozen=True)
class Injected:
    """What a fault did (a line for the log) and when it struck (wall clock: the kill, the
    stop, the cut; not the look-ups before it), from which its pause is measured."""

    what: str
    at: float


#: A fault, bound to what it acts on; None when there was nothing to act on.
Fault = Callable[[], Injected | None]


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
    """What every bed's common faults act on: the Spark job and its cluster."""

    cluster: Cluster
    driver: Driver
    rng: random.Random


def kill_driver(target: Target) -> Injected | None:
    at = time.time()
    if not target.driver.kill():
        return None
    return Injected("SIGKILL of the driver (Python and its JVM)", at)


def kill_executor(target: Target) -> Injected | None:
    executors = target.cluster.executors()
    if not executors:
        return None
    worker, pid = target.rng.choice(executors)
    at = time.time()
    target.cluster.kill_executor(pid)
    return Injected(f"SIGKILL of the executor on worker {worker} (pid {pid})", at)


def job_kinds(target: Target) -> dict[str, Fault]:
    """The faults of the Spark job itself, on either bed."""
    return {
        "kill the driver": partial(kill_driver, target),
        "kill an executor": partial(kill_executor, target),
    }


def restart_server(bed: FaultBed, rng: random.Random) -> Injected | None:
    down = round(rng.uniform(2, 8), 1)
    at = time.time()
    if rng.random() < 0.5:
        mode: Literal["immediate", "fast"] = rng.choice(["immediate", "fast"])
        bed.postgres_server.stop(mode)
        time.sleep(down)
        bed.postgres_server.start()
        return Injected(f"Postgres stopped (-m {mode}), started {down} s later", at)
    bed.kafka_server.kill()
    time.sleep(down)
    bed.kafka_server.start()
    bed.kafka_server.wait_transactions_ready()
    return Injected(f"Kafka broker SIGKILLed, started {down} s later", at)


def cut_link(bed: FaultBed, rng: random.Random) -> Injected | None:
    name, proxy = rng.choice([("Postgres", bed.postgres_proxy), ("Kafka", bed.kafka_proxy)])
    seconds = round(rng.uniform(3, 10), 1)
    kinds: list[tuple[str, Callable[[], AbstractContextManager[Any]]]] = [
        ("refused (proxy disabled)", proxy.disabled),
        ("reset (TCP RST)", proxy.reset_peer),
        ("black-holed", proxy.black_hole),
    ]
    how, cut = rng.choice(kinds)
    at = time.time()
    with cut():
        time.sleep(seconds)
    return Injected(f"link to {name} {how} for {seconds} s", at)


def fault_bed_kinds(target: Target, bed: FaultBed) -> dict[str, Fault]:
    """The faults of a run on the faults bed: the job's, a server restarted, a link cut."""
    return {
        **job_kinds(target),
        "restart a server": partial(restart_server, bed, target.rng),
        "cut a link": partial(cut_link, bed, target.rng),
    }


class Schedule:
    """Which kind comes next: each kind once per round, rounds shuffled, so that every kind
    is injected about as often as the others whatever the run's length."""

    def __init__(self, rng: random.Random, kinds: list[str]) -> None:
        self._rng = rng
        self._kinds = list(kinds)
        self._round: list[str] = []

    def next(self) -> str:
        if not self._round:
            self._round = list(self._kinds)
            self._rng.shuffle(self._round)
        return self._round.pop()
