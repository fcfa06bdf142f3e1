"""A local sink with Kafka's commit semantics, to exercise the last-resource path without a
broker: its prepared epoch lives only in the writer's memory (not resumable), and its commit
writes the epoch's rows together with the decision record, atomically, as Kafka's transaction
carries the progress record.

Layout: `<path>/gens/<generation>/<epoch>.arrow` (an Arrow IPC file whose schema metadata holds
the decision). Opening generation g renames every older `gens/<n>` to `retired/<n>`: a commit
by an older writer then fails (its folder no longer exists), like a fenced Kafka producer.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa

from durable_sinks.core import (
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from durable_sinks.core.durable_fs import fsync_dir, write_durable_temp
from durable_sinks.core.errors import ConfigError, FencedError, ParticipantLostError
from durable_sinks.core.protocol import JSON
from durable_sinks.testing import COLUMNS, Row

_WIDTH = 12


class JournalSink:
    def __init__(self, path: Path, name: str = "journal") -> None:
        self.path = path
        self._name = name
        self._context: OpenContext | None = None
        self._folder = Path()
        self._epoch: int | None = None
        self._participant = ""
        self._batches: list[pa.RecordBatch] = []
        self._attempts: dict[int, int] = {}
        self._last: int | None = None

    @property
    def name(self) -> str:
        return self._name

    def open(self, context: OpenContext) -> None:
        self._context = context
        gens, retired = self.path / "gens", self.path / "retired"
        gens.mkdir(parents=True, exist_ok=True)
        retired.mkdir(exist_ok=True)
        self._folder = gens / f"{context.generation:0{_WIDTH}d}"
        self._folder.mkdir(exist_ok=True)
        for folder in gens.iterdir():
            if folder.name.isdigit() and int(folder.name) < context.generation:
                with contextlib.suppress(FileNotFoundError):
                    os.rename(folder, retired / folder.name)
        fsync_dir(gens)
        fsync_dir(retired)
        self._last = max((int(p.stem) for p in self._segments()), default=None)

    def _segments(self) -> list[Path]:
        return sorted(self.path.glob("gens/*/*.arrow")) + sorted(
            self.path.glob("retired/*/*.arrow")
        )

    def _ctx(self) -> OpenContext:
        if self._context is None:
            raise ConfigError("journal sink is not open")
        return self._context

    def capabilities(self) -> SinkCapabilities:
        return SinkCapabilities(exactly_once=True, two_phase_commit=True, resumable_prepare=False)

    def schema(self) -> pa.Schema | None:
        return self._batches[0].schema if self._batches else None

    def health_check(self) -> None:
        self._ctx()

    def metrics(self) -> Mapping[str, float]:
        return {}

    def close(self) -> None:
        self._batches = []

    def begin_epoch(self, epoch: int) -> None:
        attempt = self._attempts.get(epoch, 0)
        self._attempts[epoch] = attempt + 1
        self._epoch = epoch
        self._participant = str(self._ctx().participant(epoch, attempt))
        self._batches = []

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        self._batches.append(batch)
        return WriteResult(batch.num_rows, batch.nbytes)

    def pre_commit(self, epoch: int) -> CommitHandle:
        """Phase 1 of a non-resumable participant: everything is ready, but only in memory."""
        rows = sum(b.num_rows for b in self._batches)
        return CommitHandle(self.name, epoch, self._participant, rows, 0, "", {})

    def commit_with_decision(
        self, epoch: int, handle: CommitHandle, decision: Mapping[str, JSON]
    ) -> None:
        metadata = {
            b"decision": json.dumps(decision).encode(),
            b"participant": handle.participant.encode(),
        }
        schema = (self._batches[0].schema if self._batches else pa.schema([])).with_metadata(
            metadata
        )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, schema) as writer:
            for batch in self._batches:
                writer.write_batch(batch)
        temp = write_durable_temp(self.path, sink.getvalue().to_pybytes())
        try:
            os.link(temp, self._folder / f"{epoch:0{_WIDTH}d}.arrow")  # by path: fenced if gone
        except FileNotFoundError:
            raise FencedError(
                "a newer generation opened the journal", sink=self.name, epoch=epoch
            ) from None
        finally:
            os.unlink(temp)
        with contextlib.suppress(FileNotFoundError):
            fsync_dir(self._folder)
        self._batches = []
        self._last = epoch if self._last is None else max(self._last, epoch)

    def _segment(self, epoch: int) -> Path | None:
        name = f"{epoch:0{_WIDTH}d}.arrow"
        found = [p for p in self._segments() if p.name == name]
        if len(found) > 1:
            raise AssertionError(f"journal holds epoch {epoch} twice: {found}")
        return found[0] if found else None

    def read_decision(self, epoch: int) -> Mapping[str, JSON] | None:
        segment = self._segment(epoch)
        if segment is None:
            return None
        metadata = pa.ipc.open_file(segment).schema.metadata or {}
        decision: Mapping[str, JSON] = json.loads(metadata[b"decision"])
        return decision

    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        segment = self._segment(epoch)
        if segment is not None:
            metadata = pa.ipc.open_file(segment).schema.metadata or {}
            if metadata.get(b"participant") == handle.participant.encode():
                return CommitOutcome.ALREADY_COMMITTED
        raise ParticipantLostError(
            f"journal participant {handle.participant} cannot be committed after the fact",
            sink=self.name,
            epoch=epoch,
        )

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        if self._epoch == epoch:
            self._batches = []

    def recover_prepared(self) -> list[CommitHandle]:
        return []

    def last_committed_epoch(self) -> int | None:
        return self._last

    @staticmethod
    def read_rows(path: Path) -> list[Row]:
        rows: list[Row] = []
        for segment in sorted(path.glob("gens/*/*.arrow")) + sorted(path.glob("retired/*/*.arrow")):
            table = pa.ipc.open_file(segment).read_all()
            if table.num_columns:
                rows.extend(
                    tuple(r[c] for c in COLUMNS) for r in table.select(list(COLUMNS)).to_pylist()
                )
        return rows
