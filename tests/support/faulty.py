"""A fault-injecting wrapper around a real sink: raise chosen errors from chosen calls."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from durable_sinks.core import (
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    SinkConnector,
    WriteResult,
)


class Faulty:
    """Delegates to `inner`; `faults[method]` is a list of exceptions raised by the next calls
    of that method (one per call, before delegating), then calls go through."""

    def __init__(self, inner: SinkConnector, **faults: list[BaseException]) -> None:
        self.inner = inner
        self.faults = {name: list(errors) for name, errors in faults.items()}
        self.calls: dict[str, int] = {}

    def _enter(self, method: str) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        pending = self.faults.get(method)
        if pending:
            raise pending.pop(0)

    @property
    def name(self) -> str:
        return self.inner.name

    def open(self, context: OpenContext) -> None:
        self._enter("open")
        self.inner.open(context)

    def begin_epoch(self, epoch: int) -> None:
        self._enter("begin_epoch")
        self.inner.begin_epoch(epoch)

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        self._enter("write_batch")
        return self.inner.write_batch(batch)

    def pre_commit(self, epoch: int) -> CommitHandle:
        self._enter("pre_commit")
        return self.inner.pre_commit(epoch)

    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        self._enter("commit_epoch")
        return self.inner.commit_epoch(epoch, handle)

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        self._enter("rollback_epoch")
        self.inner.rollback_epoch(epoch, handle)

    def recover_prepared(self) -> list[CommitHandle]:
        return self.inner.recover_prepared()

    def last_committed_epoch(self) -> int | None:
        return self.inner.last_committed_epoch()

    def capabilities(self) -> SinkCapabilities:
        return self.inner.capabilities()

    def schema(self) -> pa.Schema | None:
        return self.inner.schema()

    def health_check(self) -> None:
        self.inner.health_check()

    def metrics(self) -> Mapping[str, float]:
        return self.inner.metrics()

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
