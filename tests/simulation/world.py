"""One simulated job against real servers: its shape (targets, decision store, options), the
schedule of a zombie driver and its successor, and the audit after them.

A case runs three epochs of one job (module `cases` enumerates them):

1. epoch 0, committed by a first coordinator (the job's history);
2. the race: coordinator A (the zombie: a driver presumed dead but still running) runs epoch
   1; after A's `zombie_steps`-th step, coordinator B (its successor) starts, which claims a
   newer generation and recovers, then replays epoch 1 as Spark does after a restart; after
   B's `successor_steps`-th step A resumes and runs to its end (or its error), then B does.
   One state-changing call of the two (the case's fault) fails before reaching its server,
   or takes effect and loses its answer (`faults`);
3. a restart: coordinator R starts (faults off), replays epoch 1 and runs epoch 2.

The audit then reads every target with its own readers and asks for every row of the three
epochs exactly once (a refused row once in the dead letter instead), nothing prepared, no
open upload, no stray file. A and B may fail, with typed errors only (DurableSinkError); R
may not fail at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import uuid
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient

from durable_sinks.clients.s3 import S3Location
from durable_sinks.coordinator import Coordinator, EpochResult, prepare_part
from durable_sinks.core import CommitHandle
from durable_sinks.core.bad_rows import BadRowCap, BadRowPolicy, WritePolicy
from durable_sinks.core.errors import DurableSinkError, FencedError
from durable_sinks.manifest import DecisionStore, LocalDirectoryStore, default_store_for
from durable_sinks.manifest.s3 import S3DecisionStore
from durable_sinks.testing import COLUMNS, DEAD_LETTER_COLUMNS, Row, Target
from durable_sinks.testing._scenario import to_batches
from tests.services import KafkaEndpoint, PostgresEndpoint, S3Endpoint
from tests.simulation import faults as inject
from tests.simulation.faults import Faults, Outcome
from tests.support.delta_target import DeltaTarget
from tests.support.iceberg_target import IcebergCatalog, IcebergTarget
from tests.support.refusing_sink import CONFORMANCE_BAD_ROWS, RefusingConformanceFileSink
from tests.support.s3_target import S3Target
from tests.support.targets import FileTarget, KafkaTarget, PostgresTarget

#: The stream every coordinator of a case writes (Spark's query id, in a real job).
STREAM = "simulation-stream"
EPOCHS = (0, 1, 2)
Steps = Generator[str, None, Any]


# -- the epochs ------------------------------------------------------------------------------------
def epoch_rows(epoch: int, refused: bool) -> list[list[Row]]:
    """Two batches of two rows; with `refused`, the second batch's last row is one the
    refusing files target refuses (a negative `n`)."""
    rows: list[list[Row]] = [
        [(f"{epoch}:0:0", epoch, "a", 0.5, True), (f"{epoch}:0:1", None, "ü", None, None)],
        [(f"{epoch}:1:0", 7, None, -1.5, False), (f"{epoch}:1:1", 8, "z", 2.0, True)],
    ]
    if refused:
        rows[1][1] = (f"{epoch}:1:1", -8, "bad", 2.0, True)
    return rows


def batches(epoch: int, refused: bool) -> list[pa.RecordBatch]:
    return to_batches(epoch_rows(epoch, refused))


# -- the job ---------------------------------------------------------------------------------------
@dataclass
class Servers:
    """The test bed's servers a shape may use, and a folder for the case's local state."""

    postgres: PostgresEndpoint
    schema: str
    kafka: KafkaEndpoint
    admin: AdminClient
    progress_topic: str
    s3: S3Endpoint
    folder: Path


@dataclass
class World:
    """One case's job: fresh targets, a decision store, the coordinators' options, and how
    the shape's clients take faults."""

    job_id: str
    targets: list[Target]
    store: Callable[[], DecisionStore]
    install: Callable[[pytest.MonkeyPatch, Faults], contextlib.AbstractContextManager[None]]
    dead_letter: Target | None = None
    options: dict[str, Any] = field(default_factory=dict)
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    #: Executor mode: each batch is one Spark partition's part, prepared by `prepare_part`.
    executor: bool = False

    @property
    def refused(self) -> bool:
        return self.dead_letter is not None

    def epoch_steps(self, coordinator: Coordinator, epoch: int) -> Steps:
        """The steps of `coordinator` running `epoch` (the same rows every time)."""
        if not self.executor:
            return coordinator.epoch_steps(epoch, batches(epoch, self.refused))

        def prepare(generation: int) -> list[CommitHandle]:
            handles: list[CommitHandle] = []
            for part, batch in enumerate(batches(epoch, self.refused)):
                handles += prepare_part(
                    self.job_id,
                    generation,
                    epoch,
                    f"p{part}-t{generation}",
                    lambda: [t.connector() for t in self.targets],
                    [batch],
                )
            return handles

        return coordinator.distributed_epoch_steps(epoch, prepare)

    def run(self, coordinator: Coordinator, epoch: int) -> None:
        """`coordinator` runs `epoch` to its end; its error, if any, is raised."""
        for _ in self.epoch_steps(coordinator, epoch):
            pass

    def coordinator(self) -> Coordinator:
        extra: dict[str, Any] = dict(self.options)
        if self.dead_letter is not None:
            extra |= {
                "policy": WritePolicy(on_bad_rows=BadRowPolicy.DEAD_LETTER),
                "dead_letter": self.dead_letter.connector(),
                "bad_row_cap": BadRowCap(1.0),
            }
        return Coordinator(
            self.job_id,
            [t.connector() for t in self.targets],
            self.store(),
            source=STREAM,
            executor_mode=self.executor,
            **extra,
        )

    def cleanup(self) -> None:
        for target in [*self.targets, *([self.dead_letter] if self.dead_letter else [])]:
            done = getattr(target, "cleanup", None)
            if done is not None:
                done()
        for cleanup in self.cleanups:
            cleanup()


@contextlib.contextmanager
def _patched(
    monkeypatch: pytest.MonkeyPatch, faults: Faults, *, s3_client: Any = None, roots: list[Path]
) -> Iterator[None]:
    with monkeypatch.context() as patch:
        inject.postgres(patch, faults)
        inject.kafka(patch, faults)
        inject.folders(patch, roots, faults)
        with inject.s3(s3_client, faults) if s3_client is not None else contextlib.nullcontext():
            yield


def _local_store(servers: Servers, job: str) -> tuple[Callable[[], DecisionStore], Path]:
    folder = servers.folder / f"{job}-store"
    return (lambda: LocalDirectoryStore(folder)), folder


def postgres_alone(servers: Servers, job: str) -> World:
    """Postgres alone: one phase (rows, marker and decision in one transaction)."""
    store, folder = _local_store(servers, job)
    target = PostgresTarget(servers.postgres, servers.schema, job)
    return World(
        job,
        [target],
        store,
        lambda patch, f: _patched(patch, f, roots=[folder]),
    )


def postgres_kafka(servers: Servers, job: str) -> World:
    """Postgres and Kafka, two phases; Kafka is the last resource (its commit carries the
    decision, the progress topic holds it)."""
    store, folder = _local_store(servers, job)
    targets: list[Target] = [
        PostgresTarget(servers.postgres, servers.schema, job),
        KafkaTarget(servers.kafka, servers.admin, servers.progress_topic),
    ]
    return World(job, targets, store, lambda patch, f: _patched(patch, f, roots=[folder]))


def kafka_alone(servers: Servers, job: str) -> World:
    """Kafka alone: its commit is the decision."""
    store, folder = _local_store(servers, job)
    targets: list[Target] = [KafkaTarget(servers.kafka, servers.admin, servers.progress_topic)]
    return World(job, targets, store, lambda patch, f: _patched(patch, f, roots=[folder]))


def kafka_kafka(servers: Servers, job: str) -> World:
    """Two Kafka sinks of one cluster: one producer, one transaction per epoch; the first
    carries the decision, the second's progress record rides in its commit."""
    store, folder = _local_store(servers, job)
    targets: list[Target] = [
        KafkaTarget(servers.kafka, servers.admin, servers.progress_topic),
        KafkaTarget(servers.kafka, servers.admin, servers.progress_topic, name="audit"),
    ]
    return World(job, targets, store, lambda patch, f: _patched(patch, f, roots=[folder]))


def postgres_s3(servers: Servers, job: str) -> World:
    """Postgres and S3, two phases, decisions in the S3 decision store."""
    s3_target = S3Target(servers.s3)
    connection = s3_target.config().connection
    location = S3Location(servers.s3.bucket, f"{s3_target.prefix}-decisions")
    targets: list[Target] = [PostgresTarget(servers.postgres, servers.schema, job), s3_target]
    world = World(
        job,
        targets,
        lambda: S3DecisionStore(location, connection),
        lambda patch, f: _patched(patch, f, s3_client=connection.client(), roots=[]),
    )
    return world


def files_dead_letters(servers: Servers, job: str) -> World:
    """A files target refusing rows, another files target, and a files dead-letter sink."""
    store, folder = _local_store(servers, job)
    data = servers.folder / f"{job}-data"
    targets: list[Target] = [
        FileTarget(data / "a", "a", RefusingConformanceFileSink, bad_rows=CONFORMANCE_BAD_ROWS),
        FileTarget(data / "b", "b"),
    ]
    dead = FileTarget(data / "dead", "dead_letters", columns=DEAD_LETTER_COLUMNS)
    return World(
        job,
        targets,
        store,
        lambda patch, f: _patched(patch, f, roots=[folder, data]),
        dead_letter=dead,
    )


def delta_alone(servers: Servers, job: str) -> World:
    """A Delta table in S3, its decisions in the store beside it (`_decisions`)."""
    delta = DeltaTarget(s3=servers.s3)
    options = dataclasses.asdict(delta.config())

    def store() -> S3DecisionStore:
        found = default_store_for("delta", options)
        assert isinstance(found, S3DecisionStore)
        return found

    client = store().connection.client()  # the cached client every store and sink shares

    @contextlib.contextmanager
    def install(patch: pytest.MonkeyPatch, faults: Faults) -> Iterator[None]:
        with _patched(patch, faults, s3_client=client, roots=[]):
            inject.delta(patch, faults)
            yield

    return World(job, [delta], store, install)


def iceberg_postgres(servers: Servers, job: str) -> World:
    """An Iceberg table (SQL catalog, local warehouse) and Postgres, two phases."""
    catalog = IcebergCatalog(servers.postgres, servers.folder / job)
    catalog.create_namespace()
    store, folder = _local_store(servers, job)
    targets: list[Target] = [
        IcebergTarget(catalog),
        PostgresTarget(servers.postgres, servers.schema, job),
    ]

    @contextlib.contextmanager
    def install(patch: pytest.MonkeyPatch, faults: Faults) -> Iterator[None]:
        with _patched(patch, faults, roots=[folder]):
            inject.iceberg(patch, faults)
            yield

    return World(job, targets, store, install, cleanups=[catalog.drop])


def executor_postgres_s3(servers: Servers, job: str) -> World:
    """Executor mode: each partition's part prepared apart (prepare_part), Postgres and S3,
    decisions in the S3 decision store."""
    world = postgres_s3(servers, job)
    world.executor = True
    return world


#: The job shapes, by name.
SHAPES: dict[str, Callable[[Servers, str], World]] = {
    "postgres": postgres_alone,
    "postgres+kafka": postgres_kafka,
    "kafka": kafka_alone,
    "kafka+kafka": kafka_kafka,
    "postgres+s3/s3-store": postgres_s3,
    "files+dead-letters": files_dead_letters,
    "delta/beside-table": delta_alone,
    "iceberg+postgres": iceberg_postgres,
    "executor:postgres+s3/s3-store": executor_postgres_s3,
}


# -- one case --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """A schedule and a fault (module docstring). `zombie_steps` None: A runs its whole
    epoch before B starts; `successor_steps` None: B runs to its end before A resumes."""

    shape: str
    zombie_steps: int | None = None
    successor_steps: int | None = None
    fault: int | None = None
    outcome: Outcome = Outcome.BEFORE

    def __str__(self) -> str:
        a = "A whole" if self.zombie_steps is None else f"A {self.zombie_steps} steps"
        b = "B whole" if self.successor_steps is None else f"B {self.successor_steps} steps"
        fault = "" if self.fault is None else f", call {self.fault} {self.outcome.value}"
        return f"{self.shape}: {a}, {b}{fault}"


class Driver:
    """One coordinator's procedure, advanced step by step; a typed error ends it."""

    def __init__(self, name: str, steps: Steps) -> None:
        self.name = name
        self.steps = steps
        self.trace: list[str] = []
        self.done = False
        self.result: Any = None
        self.error: DurableSinkError | None = None

    def advance(self, count: int | None = None) -> None:
        """`count` steps (None: to the end)."""
        while not self.done and (count is None or count > 0):
            try:
                self.trace.append(next(self.steps))
            except StopIteration as finished:
                self.done, self.result = True, finished.value
            except DurableSinkError as exc:
                self.done, self.error = True, exc
            if count is not None:
                count -= 1


@dataclass
class Report:
    """What a case did: both drivers' steps and ends, the calls made, the audit's findings."""

    case: Case
    zombie: list[str]
    successor: list[str]
    calls: list[str]
    ends: dict[str, str]
    problems: list[str]
    #: The call that failed (`client:operation`), None without a fault or when the run made
    #: fewer calls than the fault's number.
    hit: str | None = None

    @property
    def successor_length(self) -> int:
        return len(self.successor)


def _end(driver: Driver) -> str:
    if driver.error is not None:
        return f"{type(driver.error).__name__}: {driver.error}"
    result = driver.result
    return str(result.outcome.value) if isinstance(result, EpochResult) else "done"


def run_case(case: Case, servers: Servers, monkeypatch: pytest.MonkeyPatch) -> Report:
    job = f"sim-{uuid.uuid4().hex[:10]}"
    world = SHAPES[case.shape](servers, job)
    refused = world.refused
    faults = Faults(case.fault, case.outcome)
    try:
        with world.install(monkeypatch, faults):
            faults.armed = False
            first = world.coordinator()
            first.start()
            world.run(first, 0)
            first.close()

            zombie = world.coordinator()
            zombie.start()
            faults.armed = True
            a = Driver("A", world.epoch_steps(zombie, 1))
            successor = world.coordinator()

            def b_steps() -> Steps:
                yield from successor.start_steps()
                return (yield from world.epoch_steps(successor, 1))

            b = Driver("B", b_steps())
            a.advance(case.zombie_steps)
            b.advance(case.successor_steps)
            a.advance()
            b.advance()
            faults.armed = False
            for made in (zombie, successor):
                with contextlib.suppress(DurableSinkError):
                    made.close()

            restart = world.coordinator()
            restart.start()
            world.run(restart, 1)
            world.run(restart, 2)
            restart.close()
        problems = audit(world, refused) + misread(a, b)
        return Report(
            case,
            a.trace,
            b.trace,
            list(faults.calls),
            {"A": _end(a), "B": _end(b)},
            problems,
            faults.hit,
        )
    finally:
        world.cleanup()


def misread(*drivers: Driver) -> list[str]:
    """Errors that misread a lost call or a race: every fault injected is one a retry or a
    restart rides out, so an error must be retriable (the job retries, or restarts and
    recovers), or a zombie's FencedError; a ConfigError or ManifestError would send its user
    to fix a setting that is not wrong."""
    return [
        f"{d.name} raised {type(d.error).__name__}, which is not retriable: {d.error}"
        for d in drivers
        if d.error is not None
        and not d.error.retriable
        and not (d.name == "A" and isinstance(d.error, FencedError))
    ]


def audit(world: World, refused: bool) -> list[str]:
    """Every row of every epoch once in each target (a refused one once in the dead letter
    instead), nothing prepared or half-written."""
    problems: list[str] = []
    rows = [row for e in EPOCHS for batch in epoch_rows(e, refused) for row in batch]
    letters: Counter[tuple[str, int, str]] = Counter()
    for target in world.targets:
        bad = getattr(target, "bad_rows", None)
        taken = [r for r in rows if bad is None or bad.refusal(r) is None]
        letters.update((target.name, int(r[0].split(":")[0]), r[0]) for r in rows if r not in taken)
        problems += _compare(target.name, Counter(taken), Counter(target.committed_rows()))
        problems += [f"{target.name}: left over {item}" for item in target.leftovers()]
    if world.dead_letter is not None:
        index = {c: i for i, c in enumerate(DEAD_LETTER_COLUMNS)}
        seen = Counter(
            (r[index["sink"]], r[index["epoch"]], _key_of(r[index["row_json"]]))
            for r in world.dead_letter.committed_rows()
        )
        problems += _compare("dead letters", letters, seen)
        problems += [f"dead letters: left over {i}" for i in world.dead_letter.leftovers()]
    return problems


def _key_of(row_json: str) -> str:
    return str(json.loads(row_json)[COLUMNS[0]])


def _compare(name: str, expected: Counter[Any], seen: Counter[Any]) -> list[str]:
    missing = expected - seen
    extra = seen - expected
    found = []
    if missing:
        found.append(f"{name}: missing {sorted(missing.elements(), key=str)[:5]}")
    if extra:
        found.append(f"{name}: extra or duplicated {sorted(extra.elements(), key=str)[:5]}")
    return found
