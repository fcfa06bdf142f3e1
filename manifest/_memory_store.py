"""A decision store in process memory: not durable, for at-least-once jobs and unit tests."""

from __future__ import annotations

from durable_sinks.core.errors import FencedError
from durable_sinks.core.operations import Bookkeeping

from ._record import DecisionRecord
from ._store import logs_expire, logs_open, logs_put, require_open, require_own


class MemoryStoreBackend:
    """What several MemoryDecisionStore instances share (the 'disk' of a simulated restart
    within one process)."""

    def __init__(self) -> None:
        self.generation: dict[str, int] = {}
        self.records: dict[tuple[str, int], DecisionRecord] = {}
        self.finished: set[tuple[str, int]] = set()


class MemoryDecisionStore:
    """Same contract as LocalDirectoryStore, except `durable` is False: everything is lost
    with the process. Validation refuses it for exactly-once jobs."""

    def __init__(self, backend: MemoryStoreBackend | None = None) -> None:
        self.backend = backend or MemoryStoreBackend()
        self._job: str | None = None
        self._generation = -1

    @property
    def durable(self) -> bool:
        return False

    @logs_open
    def open(self, job_id: str) -> int:
        self._job = job_id
        self._generation = self.backend.generation.get(job_id, 0) + 1
        self.backend.generation[job_id] = self._generation
        return self._generation

    def peek_generation(self, job_id: str) -> int:
        return self.backend.generation.get(job_id, 0)

    def peek(self, job_id: str, epoch: int) -> DecisionRecord | None:
        return self.backend.records.get((job_id, epoch))

    def peek_latest(self, job_id: str) -> int | None:
        return max((e for j, e in self.backend.records if j == job_id), default=None)

    def _job_id(self) -> str:
        return require_open(self._job)

    @logs_put
    def put(self, record: DecisionRecord) -> DecisionRecord:
        job = self._job_id()
        require_own(record, job, self._generation)
        if self.backend.generation[job] != self._generation:
            raise FencedError("a newer coordinator took over this job", job=job, epoch=record.epoch)
        return self.backend.records.setdefault((job, record.epoch), record)

    def get(self, epoch: int) -> DecisionRecord | None:
        return self.backend.records.get((self._job_id(), epoch))

    def mark_finished(self, epoch: int) -> None:
        self.backend.finished.add((self._job_id(), epoch))

    def is_finished(self, epoch: int) -> bool:
        return (self._job_id(), epoch) in self.backend.finished

    def latest_epoch(self) -> int | None:
        job = self._job_id()
        return max((epoch for j, epoch in self.backend.records if j == job), default=None)

    @logs_expire
    def expire(self, before_epoch: int) -> int:
        job = self._job_id()
        doomed = [
            key
            for key in self.backend.records
            if key[0] == job and key[1] < before_epoch and key in self.backend.finished
        ]
        for key in doomed:
            del self.backend.records[key]
            self.backend.finished.discard(key)
        return len(doomed)

    def drop_job(self, job_id: str, *, apply: bool) -> list[Bookkeeping]:
        """Nothing durable to remove: the records live in this process only."""
        return []

    def close(self) -> None:
        """Nothing to release."""
