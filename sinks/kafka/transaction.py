"""One Kafka transaction per epoch for every Kafka sink of a job on one cluster.

A Kafka transaction spans any topics of one cluster, so the job's Kafka sinks there (targets,
and a Kafka dead-letter topic) share one transactional producer, `ds:<job>:<carrier>`, where
the carrier is the sink that carries the epoch's decision (the coordinator's last resource,
first in OpenContext.transaction). Each member produces its records and, at its pre_commit,
its progress record (without the decision) into the epoch's one transaction; the carrier's
commit produces its own progress record (with the decision) and commits them all at once. So
every member's epoch is committed exactly when the carrier's is, and each member's progress
topic says so on its own (its last committed epoch, its audit).

A sink alone has a SharedTransaction of its own: the same code, one member.

What is shared lives in this process only (driver mode: Kafka sinks are never prepared on
executors), keyed by (job, generation, carrier): a coordinator's members find each other when
they open; another generation (a newer coordinator in the same process) has its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from durable_sinks.core.errors import ConfigError

from .config import Kafka
from .writer import TransactionalProducer


@dataclass(frozen=True)
class RidingRecord:
    """A member's progress record, waiting in the epoch's transaction for the carrier's
    commit."""

    topic: str
    key: bytes
    value: bytes


@dataclass
class SharedTransaction:
    """The producer and the open transaction of one job's Kafka sinks on one cluster (see the
    module docstring). Used from the coordinator's one thread."""

    producer: TransactionalProducer
    #: The members' names, the carrier first.
    members: tuple[str, ...]
    #: Members that opened (and not closed) with this object.
    opened: set[str] = field(default_factory=set)
    #: Whether the producer owns the transactional.id (init_transactions ran).
    started: bool = False
    #: The open transaction: its number (counted from 1) and epoch; 0 / None when none is.
    number: int = 0
    epoch: int | None = None
    #: The number of the last transaction this object committed.
    committed: int = 0
    #: Members' progress records for the open transaction.
    riding: dict[str, RidingRecord] = field(default_factory=dict)
    _count: int = 0

    def begin(self, epoch: int) -> int:
        """The number of `epoch`'s open transaction: begun now, or joined when another
        member began it. A transaction of another epoch still open is aborted first."""
        if self.epoch == epoch and self.number:
            return self.number
        if self.number:
            self.abort(self.number)
        self.producer.begin(epoch)
        self._count += 1
        self.number, self.epoch = self._count, epoch
        self.riding.clear()
        return self.number

    def is_open(self, number: int) -> bool:
        return number != 0 and number == self.number

    def abort(self, number: int) -> None:
        """Abort transaction `number` if it is the open one (else it already ended)."""
        if not self.is_open(number):
            return
        epoch = self.epoch
        self._ended()
        self.producer.abort(epoch)

    def abort_quietly(self, number: int) -> None:
        """Abort after a failure that is being raised anyway."""
        if self.is_open(number):
            epoch = self.epoch
            self._ended()
            self.producer.abort_quietly(epoch)

    def ended(self, number: int, *, committed: bool) -> None:
        """Transaction `number` ended (committed, or dropped with its producer)."""
        if self.is_open(number):
            self._ended()
            if committed:
                self.committed = number

    def _ended(self) -> None:
        self.number, self.epoch = 0, None
        self.riding.clear()

    def restarted(self) -> None:
        """The producer was replaced: what it had open is gone (the new one's
        init_transactions aborted it)."""
        self._ended()
        self.started = True


_SHARED: dict[tuple[str, int, str], SharedTransaction] = {}
_LOCK = threading.Lock()


def join(
    job_id: str,
    generation: int,
    members: tuple[str, ...],
    config: Kafka,
    make: Callable[[], TransactionalProducer],
) -> SharedTransaction:
    """The shared transaction of `members` (their sink `config.name` among them), made with
    `make` by the first member to open. ConfigError when this member's producer settings
    differ from the producer's: one producer serves them all."""
    key = (job_id, generation, members[0])
    with _LOCK:
        shared = _SHARED.get(key)
        if shared is None:
            shared = _SHARED[key] = SharedTransaction(make(), members)
        shared.opened.add(config.name)
    _check_same_producer(shared, config)
    return shared


def leave(shared: SharedTransaction, sink: str) -> None:
    """`sink` closed: the producer is closed with the last member."""
    with _LOCK:
        shared.opened.discard(sink)
        last = not shared.opened
        if last:
            for key, found in list(_SHARED.items()):
                if found is shared:
                    del _SHARED[key]
    if last:
        shared.producer.close()


def _check_same_producer(shared: SharedTransaction, config: Kafka) -> None:
    theirs = shared.producer.config
    differ = [
        name
        for name in ("producer_config", "transaction_timeout_s", "request_timeout_s")
        if getattr(theirs, name) != getattr(config, name)
    ]
    if differ:
        leave(shared, config.name)
        raise ConfigError(
            f"kafka sinks {list(shared.members)} share one transaction (one producer on their "
            f"cluster), but sink {config.name!r} gives other {', '.join(differ)} than sink "
            f"{theirs.name!r}",
            sink=config.name,
            fix=f"give every Kafka sink of the job on this cluster the same {', '.join(differ)}",
        )
