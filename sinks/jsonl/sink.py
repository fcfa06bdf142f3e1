"""The JSON Lines sink: the protocol's methods (core/protocol.py), each handing over to one
role (writer, committer, recovery, views) and holding only what one instance needs between
calls: its open context, the participant being written and its counters.

Call order, on one instance: `open`, then per epoch `begin_epoch`, `write_batch`...,
`pre_commit`, and `commit_epoch` or `rollback_epoch` (possibly on another instance, given the
handle); `recover_prepared` once after `open` at start; `close` at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from durable_sinks.core.durable_fs import probe_folder
from durable_sinks.core.errors import ConfigError, UsageError
from durable_sinks.core.naming import component
from durable_sinks.core.operations import Holding, Prepared
from durable_sinks.core.protocol import (
    CommitHandle,
    CommitOutcome,
    OpenContext,
    SinkCapabilities,
    WriteResult,
)

from . import committer, recovery, views
from .config import JsonlSinkConfig
from .handles import JsonlHandle
from .layout import PROBE, Layout
from .writer import StagedParticipant

if TYPE_CHECKING:
    import pyarrow as pa


class JsonlSink:
    """Exactly-once JSON Lines files through staging folders and create-only renames.

    Implements SinkConnector, DistributedSink (executors prepare, the driver commits) and
    OperableSink (the `durable-sinks` command's views)."""

    def __init__(self, config: JsonlSinkConfig) -> None:
        # Nothing is touched here: a sink is built on the driver to check its options, and
        # may be pickled to executors. The folder is first used in `open`.
        self.config = config
        self.layout = Layout(Path(config.path))
        self._context: OpenContext | None = None
        self._current: StagedParticipant | None = None
        self._attempts: dict[int, int] = {}
        self._schema: pa.Schema | None = None
        self._last_committed: int | None = None
        self._counters = {"rows": 0.0, "bytes": 0.0, "epochs_committed": 0.0, "rollbacks": 0.0}

    @property
    def name(self) -> str:
        return self.config.name

    def __repr__(self) -> str:
        return f"JsonlSink(name={self.name!r}, path={self.config.path!r})"

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self, context: OpenContext) -> None:
        self._context = context
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

    def close(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            current.close()

    def capabilities(self) -> SinkCapabilities:
        # A staged folder outlives its writer and any process can rename it (resumable and
        # distributed prepare); parts of one epoch publish side by side (partitioned).
        return SinkCapabilities(
            exactly_once=True,
            two_phase_commit=True,
            resumable_prepare=True,
            distributed_prepare=True,
            partitioned=True,
        )

    def schema(self) -> pa.Schema | None:
        return self._schema  # JSON Lines has no schema of its own: the first batch's

    def health_check(self) -> None:
        """Probe that the job can create, link and delete files in the staging area. The
        probe's names carry the job, the sink and the generation; a start killed while
        probing leaves them behind, and a later generation's probe removes them."""
        ctx = self._ctx()
        area = self.layout.staging_area
        owner = f"{PROBE}:{component(ctx.job_id)}:{component(self.name)}:"
        try:
            for stale in area.glob(f"{owner}*"):
                generation = stale.name.removeprefix(owner).removesuffix(".link")
                if generation.isdigit() and int(generation) < ctx.generation:
                    stale.unlink(missing_ok=True)
            probe_folder(area, f"{owner}{ctx.generation}", fsync=self.config.fsync)
        except OSError as exc:
            raise ConfigError(
                f"cannot write in {self.layout.root}: {exc.strerror}",
                job=ctx.job_id,
                sink=self.name,
                fix="give the job write access to the folder, on a local file system",
            ) from exc

    def metrics(self) -> Mapping[str, float]:
        return dict(self._counters)

    # -- phase 1: writer.py ------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        ctx = self._ctx()
        if self._current is not None:  # an attempt that failed before its rollback finished
            self._current.discard()
            self._current = None
        attempt = self._attempts.get(epoch, 0)
        self._attempts[epoch] = attempt + 1
        name = ctx.participant(epoch, attempt)
        self._current = StagedParticipant(self.layout, ctx, epoch, name, self.config.fsync)

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        result = self._require_current().write(batch)
        if self._schema is None:
            self._schema = batch.schema
        self._counters["rows"] += result.rows
        self._counters["bytes"] += result.bytes
        return result

    def pre_commit(self, epoch: int) -> CommitHandle:
        current = self._require_current()
        if current.epoch != epoch:
            raise UsageError(
                f"pre_commit({epoch}) while epoch {current.epoch} is open",
                job=self._ctx().job_id,
                sink=self.name,
            )
        handle = current.prepare(self.name)
        self._current = None
        return handle

    # -- phase 2: committer.py ---------------------------------------------------------------
    def commit_epoch(self, epoch: int, handle: CommitHandle) -> CommitOutcome:
        ctx = self._ctx()
        outcome = committer.commit(
            self.layout, ctx, JsonlHandle.parse(handle), fsync=self.config.fsync
        )
        if self._last_committed is None or epoch > self._last_committed:
            self._last_committed = epoch
        if outcome is CommitOutcome.COMMITTED:
            self._counters["epochs_committed"] += 1
        return outcome

    def rollback_epoch(self, epoch: int, handle: CommitHandle | None) -> None:
        self._ctx()
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
            self._counters["rollbacks"] += 1

    # -- recovery: recovery.py ---------------------------------------------------------------
    def recover_prepared(self) -> list[CommitHandle]:
        return recovery.leftovers(self.layout, self._ctx())

    def prepared_participants(self, epoch: int) -> list[CommitHandle]:
        return recovery.prepared_of_epoch(self.layout, self._ctx(), epoch)

    def last_committed_epoch(self) -> int | None:
        """Read from the published markers at `open` (recovery.last_committed), then moved by
        this instance's commits: within one generation only this instance commits."""
        return self._last_committed

    # -- operator views: views.py ------------------------------------------------------------
    def in_doubt(self) -> list[Prepared]:
        return views.in_doubt(self.layout, self._ctx())

    def holdings(self, first: int, last: int) -> dict[int, Holding]:
        self._ctx()
        return views.holdings(self.layout, first, last)

    def live_generations(self) -> Sequence[int]:
        return []  # a folder keeps no sessions: no running coordinator can be seen

    # -- the open context and the participant being written ---------------------------------
    def _ctx(self) -> OpenContext:
        if self._context is None:
            raise UsageError(f"{self!r} is not open; the coordinator opens sinks")
        return self._context

    def _require_current(self) -> StagedParticipant:
        if self._current is None:
            raise UsageError(
                "no epoch is open; call begin_epoch first", job=self._ctx().job_id, sink=self.name
            )
        return self._current
