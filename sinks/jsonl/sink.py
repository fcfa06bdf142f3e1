"""The JSON Lines sink: the protocol's methods (core/protocol.py), each handing over to one
role (writer, committer, recovery, views). What one instance keeps between calls (its open
context, attempt counters, counters, the last committed epoch) is the shared base's,
core/sink_base.py; this class adds only the participant being written and the schema.

Call order, on one instance: `open`, then per epoch `begin_epoch`, `write_batch`...,
`pre_commit`, and `commit_epoch` or `rollback_epoch` (possibly on another instance, given the
handle); `recover_prepared` once after `open` at start; `close` at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from durable_sinks.core.durable_fs import probe_as_owner
from durable_sinks.core.errors import ConfigError, DurableSinkError, UsageError
from durable_sinks.core.naming import component
from durable_sinks.core.operations import Holding, Prepared
from durable_sinks.core.protocol import (
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)
from durable_sinks.core.sink_base import SinkBase, Step

from . import committer, recovery, views
from .config import Jsonl
from .handles import JsonlHandle
from .layout import PROBE, Layout
from .writer import JsonlParticipant

if TYPE_CHECKING:
    import pyarrow as pa


class JsonlSink(SinkBase[Jsonl]):
    """Exactly-once JSON Lines files through staging folders and create-only renames.

    Implements SinkConnector, DistributedSink (executors prepare, the driver commits) and
    OperableSink (the `durable-sinks` command's views)."""

    KEEPS_COMMIT_RECORD = True

    def __init__(self, config: Jsonl) -> None:
        # Nothing is touched here: a sink is built on the driver to check its options, and
        # may be pickled to executors. The folder is first used in `open`.
        super().__init__(config)
        self.layout = Layout(Path(config.path))
        self._current: JsonlParticipant | None = None
        self._schema: pa.Schema | None = None

    def _target(self) -> str:
        return f"path={self.config.path!r}"

    def _translate(self, exc: Exception, step: Step) -> DurableSinkError | None:
        """The file system's errors mean nothing beyond themselves here: the writer raises
        FencedError itself when its staging folder vanished (writer.py)."""
        return None

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        self._opening(context)
        if not context.inspect:  # an operator's tool only reads: it creates nothing
            try:
                self.layout.staging_area.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    f"cannot create {self.layout.staging_area}: {exc.strerror}",
                    job=context.job_id,
                    sink=self.name,
                    fix="point the jsonl sink at a writable folder",
                ) from exc
        self._last_committed = recovery.last_committed(self.layout, context)

    def _read_last_committed(self) -> int | None:
        with self.translated("read the committed epochs"):
            return recovery.last_committed(self.layout, self.context)

    def close(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            current.close()

    def capabilities(self) -> SinkCapabilities:
        # A staged folder outlives its writer and any process can rename it (resumable and
        # distributed prepare); parts of one epoch publish side by side (partitioned). Each
        # line is a JSON object of its own row's columns, whatever the batch's schema: a new
        # or missing column is just a key more or less (schema evolution).
        return SinkCapabilities(
            exactly_once=True,
            two_phase_commit=True,
            resumable_prepare=True,
            distributed_prepare=True,
            partitioned=True,
            schema_evolution=True,
        )

    def schema(self) -> pa.Schema | None:
        return self._schema  # JSON Lines has no schema of its own: the first batch's

    def health_check(self) -> None:
        """Probe that the job can create, link and delete files in the staging area. The
        probe's names carry the job, the sink and the generation; a start killed while
        probing leaves them behind, and a later generation's probe removes them."""
        ctx = self.context
        area = self.layout.staging_area
        owner = f"{PROBE}:{component(ctx.job_id)}:{component(self.name)}:"
        try:
            probe_as_owner(area, owner, ctx.generation, fsync=self.config.fsync)
        except OSError as exc:
            raise ConfigError(
                f"cannot write in {self.layout.root}: {exc.strerror}",
                job=ctx.job_id,
                sink=self.name,
                fix="give the job write access to the folder, on a local file system",
            ) from exc

    # -- phase 1: writer.py ------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        if self._current is not None:  # an attempt that failed before its rollback finished
            self._current.discard()
            self._current = None
        name = self._next_participant(epoch)
        self._current = JsonlParticipant(self.layout, self.context, epoch, name, self.config.fsync)

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        result = self._require_current().write(batch)
        if self._schema is None:
            self._schema = batch.schema
        self._count("rows", result.rows)
        self._count("bytes", result.bytes)
        return result

    def pre_commit(self, epoch: int) -> CommitHandle:
        current = self._require_current()
        if current.epoch != epoch:
            raise UsageError(
                f"pre_commit({epoch}) while epoch {current.epoch} is open", **self.where()
            )
        handle = current.prepare(self.name)
        self._current = None
        return handle

    # -- phase 2: committer.py ---------------------------------------------------------------
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        ctx = self.context
        outcome = committer.commit(
            self.layout, ctx, JsonlHandle.parse(handle), fsync=self.config.fsync
        )
        self._committed_up_to(epoch)
        if outcome is CommitOutcome.COMMITTED:
            self._count("epochs_committed")
        return outcome

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        _ = self.context  # UsageError before open
        current = self._current
        if handle is None:
            # No handle: the attempt this instance is writing, if it is of this epoch.
            if current is None or current.epoch != epoch:
                return
            self._current = None
            current.close()
            participant = str(current.name)
        else:
            if current is not None and str(current.name) == handle.participant:
                self._current = None
                current.close()
            participant = handle.participant
        if committer.rollback(self.layout, participant, fsync=self.config.fsync):
            self._count("rollbacks")

    # -- recovery: recovery.py ---------------------------------------------------------------
    def recover_prepared(self) -> list[CommitHandle]:
        return recovery.leftovers(self.layout, self.context)

    def prepared_participants(self, epoch: int) -> list[CommitHandle]:
        return recovery.prepared_of_epoch(self.layout, self.context, epoch)

    # -- operator views: views.py ------------------------------------------------------------
    def in_doubt(self) -> list[Prepared]:
        return views.in_doubt(self.layout, self.context)

    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        _ = self.context  # UsageError before open
        return views.holdings(self.layout, first, last)

    def live_generations(self) -> Sequence[int]:
        return []  # a folder keeps no sessions: no running coordinator can be seen

    # -- the participant being written --------------------------------------------------------
    def _require_current(self) -> JsonlParticipant:
        if self._current is None:
            raise self._no_epoch()
        return self._current
