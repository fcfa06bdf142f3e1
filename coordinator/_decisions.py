"""Where an epoch's decision is found, and the checks made when an epoch has none.

A decision lives in the decision store or, when a sink is the job's commit point (Kafka as
last resource, or the only sink of a one-phase job), in that sink's own commit, which carried
it; a sink that was the commit point before the job's sinks changed still holds the decisions
its commits carried, and they count. The store caches what a slow-to-read commit point
carried (Kafka), never what a fast one carries (one-phase Postgres reads it with one indexed
query), nor what the commit point keeps as the store itself (a HostedDecisionStore of the
job's only sink: decisions are read from that sink, whose open already knows its last
committed epoch).
"""

from __future__ import annotations

from collections.abc import Sequence

from durable_sinks.core.errors import DurableSinkError, EpochOrderError, FencedError
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.protocol import LastResource, SinkConnector
from durable_sinks.manifest import DecisionRecord, DecisionStore, HostedDecisionStore

from ._metrics import EpochMetrics
from ._participants import brief


class DecisionBook:
    """The decisions of one job. `last` is the sink that carries decisions in its commit, if
    any (known once the coordinator has validated the job)."""

    def __init__(
        self,
        job_id: str,
        store: DecisionStore,
        sinks: Sequence[SinkConnector],
        last: LastResource | None,
    ) -> None:
        self.job_id = job_id
        self.store = store
        self.sinks = sinks
        self.last = last
        #: `newest_epoch()` as this coordinator's start first read it (a 1-tuple once read).
        self._newest_at_start: tuple[int | None] | None = None
        #: The epoch `look_ahead` found undecided, until that epoch's `lookup` takes it.
        self._undecided_ahead: int | None = None

    @property
    def hosted_by_last(self) -> bool:
        """Whether the store is kept by the commit point's sink (its commits are the
        records)."""
        return (
            self.last is not None
            and isinstance(self.store, HostedDecisionStore)
            and self.store.sink == self.last.name
        )

    @property
    def caches_decisions(self) -> bool:
        """Whether decisions the commit point carried are copied into the store. A
        non-resumable last resource (Kafka) is slow to read back, so the store caches its
        decisions; a one-phase sink answers read_decision with one indexed read, and an extra
        durable write per epoch would cost what one-phase commit saves; a store the last
        resource keeps has them already."""
        return (
            self.last is not None
            and not self.last.capabilities().resumable_prepare
            and not self.hosted_by_last
        )

    @property
    def store_holds_decisions(self) -> bool:
        """False in one-phase mode: the commit point's sink holds them, the store only fences
        generations (so there is nothing to mark finished or expire)."""
        return self.last is None or self.caches_decisions

    def newest_epoch(self) -> int | None:
        """The job's newest decided epoch: the store's newest record where the store holds
        decisions, and the newest epoch the commit point holds where it carries them (older
        decisions expire, never the newest)."""
        found = [self.store.latest_epoch()] if self.store_holds_decisions else []
        if self.last is not None:
            found.append(self.last.last_committed_epoch())
        known = [epoch for epoch in found if epoch is not None]
        return max(known) if known else None

    def newest_at_start(self) -> int | None:
        """`newest_epoch()` read once per coordinator and kept: what recovery, the lost-epoch
        check at start and the stream check of the first epoch compare with, one read (an S3
        listing, the commit point's marker query) instead of one per check. Valid from the
        moment the store's `open` fenced older generations until this coordinator decides an
        epoch of its own: no older coordinator can decide an epoch after that fence (the S3
        store: only a `put` already under way, which a later check then meets as a sink
        holding an epoch newer than the kept one and reports), so the only newer decisions
        are this coordinator's; the checks that use it run before its first decision."""
        if self._newest_at_start is None:
            self._newest_at_start = (self.newest_epoch(),)
        return self._newest_at_start[0]

    def decision(self, epoch: int) -> DecisionRecord | None:
        """The durable decision of `epoch`: from the store or, when a sink is the commit
        point, from the record its commit carried (recovery trusts that one)."""
        if self.hosted_by_last:
            return self._carried(epoch)
        return self.store.get(epoch) or self._carried(epoch)

    def _carried(self, epoch: int) -> DecisionRecord | None:
        """The decision a commit carried: the commit point's, else (an epoch the job
        committed before its sinks changed: a one-phase Postgres job that got a second sink)
        another sink's that can carry one and holds the epoch."""
        carriers = [self.last] if self.last is not None else []
        carriers += [s for s in self.sinks if isinstance(s, LastResource) and s is not self.last]
        for sink in carriers:
            landed = sink.last_committed_epoch()
            if landed is None or epoch > landed:
                continue  # nothing committed this epoch, so no commit carried its decision
            carried = sink.read_decision(epoch)
            if carried is not None:
                return DecisionRecord.from_json(carried, source=f"{sink.name} commit")
        return None

    def for_epoch(self, epoch: int) -> DecisionRecord | None:
        """`decision(epoch)`, copying a decision found only in the commit point into the
        store when the store caches them."""
        if self.hosted_by_last:
            return self._carried(epoch)
        decision = self.store.get(epoch)
        if decision is not None:
            return decision
        carried = self._carried(epoch)
        if carried is None or not self.caches_decisions:
            return carried
        return self.store.put(carried)

    def lookup(self, epoch: int, metrics: EpochMetrics) -> DecisionRecord | None:
        """The epoch's decision; with none, a check that no later epoch (or this one) already
        landed anywhere. Which stream a decision found came from is `same_stream`'s to tell.
        An epoch `look_ahead` found undecided is answered from that, once."""
        ahead, self._undecided_ahead = self._undecided_ahead, None
        if ahead == epoch:
            return None
        with metrics.phase("lookup"):
            decided = self.for_epoch(epoch)
            if decided is None:
                self.check_order(epoch)
        return decided

    def look_ahead(self, epoch: int, metrics: EpochMetrics, log: JobLogger) -> None:
        """`lookup(epoch)` now, for the epoch after the one this coordinator just decided,
        before that decided epoch's phase 2 starts in the background: `epoch`'s own lookup
        would run beside that phase 2, whose commits (pyiceberg's above all) hold the
        interpreter's lock, so each of its reads would wait its turn. An answer of
        "undecided" is kept for `epoch`'s `lookup`, which then reads nothing.

        Only where the decision store decides (no commit point sink): the store's `put` is
        the decision, conditional on the epoch's slot. After this coordinator decided the
        epoch before `epoch`, only another coordinator can decide `epoch`: a newer
        generation (which fenced this one) or an older one's put already under way. Either
        way this coordinator's own put of `epoch` returns that decision or raises
        FencedError, and the epoch yields to it as it would to one its lookup found. A
        failure is left to `epoch`'s own lookup, which reads again."""
        if self.last is not None:
            return
        try:
            decided = self.lookup(epoch, metrics)
        except DurableSinkError as exc:
            log.debug("epoch %d looked up ahead: %s; its batch looks it up", epoch, brief(exc))
            return
        if decided is None:
            self._undecided_ahead = epoch

    def same_stream(self, decided: DecisionRecord, source: str | None) -> bool:
        """Whether `decided` is known to hold data of the stream `source`: True when both name
        it; False when either does not name its stream (the caller must then prove that the
        epoch is a replay some other way, or refuse); EpochOrderError when they name two
        different streams (a reset checkpoint, or another query under the same job id)."""
        if source is None or decided.source is None:
            return False
        if decided.source == source:
            return True
        raise EpochOrderError(
            f"epoch {decided.epoch} was already committed with data of stream "
            f"{decided.source!r}; this job now writes stream {source!r}: the query's "
            "checkpoint was reset, deleted or moved (Spark gives it a new id), or another "
            "query writes under the same job id. Nothing of this batch was written",
            job=self.job_id,
            epoch=decided.epoch,
            fix="give each streaming query its own job_id (a query keeps its id across "
            "restarts from the same checkpoint); a query started from a new checkpoint continues "
            "the job only after its newest epoch (durable_sink(..., first_epoch=<newest + 1>): "
            "see docs/operations.md#moving-a-job-to-a-new-checkpoint), or with its old "
            "checkpoint restored",
        )

    def check_order(self, epoch: int) -> None:
        """No decision for `epoch`: make sure nothing later (or this epoch) already landed."""
        latest = None if self.hosted_by_last else self.store.latest_epoch()
        if latest is not None and latest > epoch:
            raise EpochOrderError(
                f"asked to write epoch {epoch} but epoch {latest} is already committed",
                job=self.job_id,
                epoch=epoch,
                fix="the query's checkpoint was reset or deleted, or another query uses this "
                "job_id: give the query a new job_id, or restore its checkpoint",
            )
        for sink in self.sinks:
            landed = sink.last_committed_epoch()
            if landed is not None and landed >= epoch:
                raise EpochOrderError(
                    f"the sink already holds epoch {landed} but the decision store has no "
                    f"decision for epoch {epoch}",
                    job=self.job_id,
                    sink=sink.name,
                    epoch=epoch,
                    fix="the decision store was reset or is not this job's, or the sink's data "
                    "is shared with another job: point the job at its own store and sink",
                )

    def cache(self, record: DecisionRecord, log: JobLogger) -> None:
        """Copy a decision the commit point carried into the store (a cache: a failure is
        logged, recovery reads the commit point)."""
        try:
            self.store.put(record)
        except FencedError:
            log.warning("a newer coordinator started: it reads this decision from the sink")
        except DurableSinkError as exc:
            log.warning("could not cache the decision in the store (%s)", brief(exc))

    def expire(self, epoch: int, retain: int, metrics: EpochMetrics, log: JobLogger) -> None:
        """Drop decisions older than the last `retain` epochs. House-keeping after the epoch
        committed everywhere: a failure is logged and left to the next epoch's expiry (which
        drops everything older than its own window), never raised for a committed batch."""
        if not self.store_holds_decisions:
            return
        try:
            with metrics.phase("finish"):
                self.store.expire(epoch - retain + 1)
        except DurableSinkError as exc:
            log.warning(
                "the epoch committed, but dropping old decisions failed (%s); the next epoch "
                "drops them",
                brief(exc),
            )
