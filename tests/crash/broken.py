"""Deliberately broken sinks, coordinator and store: the conformance suite must catch each."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from durable_sinks.coordinator import Coordinator
from durable_sinks.core import CommitHandle, CommitOutcome, SinkConnector, WriteResult
from durable_sinks.core.bad_rows import RefusedRows
from durable_sinks.manifest import DecisionStore, LocalDirectoryStore
from durable_sinks.sinks.folder import MARKER, FolderSink
from tests.support.faulty import Faulty
from tests.support.refusing_sink import RefusingConformanceFileSink, conformance_refusals


class NonIdempotentCommitSink(FolderSink):
    """Commits a second copy when asked to commit an already committed participant."""

    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        outcome = super().commit_epoch(epoch, handle)
        if outcome is CommitOutcome.ALREADY_COMMITTED:
            root = self.layout.root
            published = root / f"epoch={epoch}" / "part=0"
            copy = root / f"epoch={epoch}" / f"part=again-{len(list(published.parent.iterdir()))}"
            shutil.copytree(published, copy)
        return outcome


class RollbackCommitsSink(FolderSink):
    """Publishes a prepared participant when asked to roll it back."""

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        staging = self.layout.staging_area
        if handle is not None and (staging / handle.participant / MARKER).exists():
            self.commit_epoch(epoch, handle)
        else:
            super().rollback_epoch(epoch, handle)


class MarkerOutsideTransactionSink(FolderSink):
    """Keeps its epoch marker (what last_committed_epoch reads) apart from the data: written
    in phase 1 instead of moving with the data in phase 2."""

    def pre_commit(self, epoch: int) -> CommitHandle:
        handle = super().pre_commit(epoch)
        markers = self.layout.root / "markers"
        markers.mkdir(exist_ok=True)
        (markers / str(epoch)).write_text(handle.participant)
        return handle

    def _read_last_committed(self, *, listed: bool = False) -> int | None:
        markers = self.layout.root / "markers"
        epochs = [int(p.name) for p in markers.iterdir()] if markers.exists() else []
        return max(epochs, default=None)

    def last_committed_epoch(self) -> int | None:
        return self._read_last_committed()


class _CommitsAtPrepare(Faulty):
    """Wraps a sink so its data is committed in phase 1: the decision comes after."""

    def pre_commit(self, epoch: int) -> CommitHandle:
        handle = self.inner.pre_commit(epoch)
        self.inner.commit_epoch(epoch, handle)
        return handle


class DecisionAfterCommitCoordinator(Coordinator):
    """Makes participants visible before the decision is durable."""

    def __init__(
        self, job_id: str, sinks: Sequence[SinkConnector], store: DecisionStore, **kw: Any
    ) -> None:
        super().__init__(job_id, [_CommitsAtPrepare(s) for s in sinks], store, **kw)


class UnfencedStore(LocalDirectoryStore):
    """Never fences older generations: a zombie coordinator can still record decisions."""

    def _retire_older(self) -> None:
        return None


class WritesRefusedRowsToo(RefusingConformanceFileSink):
    """Reports the rows it refuses, but writes them to its target as well."""

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        refused = conformance_refusals(batch)
        written = FolderSink.write_batch(self, batch)
        return WriteResult(written.rows, written.bytes, refused)


class DropsRefusedRows(RefusingConformanceFileSink):
    """Leaves the rows it refuses out, but never reports them: they are lost."""

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        written = super().write_batch(batch)
        return WriteResult(written.rows, written.bytes, RefusedRows())


class DeadLettersBeforeDecisionCoordinator(Coordinator):
    """Makes dead letters visible when they are prepared, before the epoch's decision."""

    def __init__(
        self, job_id: str, sinks: Sequence[SinkConnector], store: DecisionStore, **kw: Any
    ) -> None:
        if kw.get("dead_letter") is not None:
            kw["dead_letter"] = _CommitsAtPrepare(kw["dead_letter"])
        super().__init__(job_id, sinks, store, **kw)
