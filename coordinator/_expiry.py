"""The sinks' per-epoch bookkeeping beyond `retain_epochs`, expired by the running job.

A sink that keeps something per committed epoch that nothing but history needs (Postgres
marker rows, a Delta table's emptied journal folders) implements
`core.operations.ExpiringSink`; after an epoch committed everywhere the coordinator asks each
such sink to delete what it keeps of epochs below `epoch - retain_epochs + 1`, the window the
decision store keeps too. What readers read through (S3's and the files sinks' epoch
markers) or what a target bounds itself (Kafka's compacted progress records, a table
format's history) is not the sinks' to expire and they do not offer it.

Cost: the sinks are asked every `max(1, retain_epochs // SPREAD)` epochs (and at the first
epoch a coordinator finishes), not after every epoch, so each call deletes a batch of that
many epochs' records; between two calls at most `retain_epochs + every - 1` epochs are kept.
A sink's expiry is one indexed delete (Postgres) or that many `rmdir`s (a local Delta table):
never a listing of the history per epoch.

House-keeping: a failure is logged and the sinks are asked again after the next epoch,
never raised for a committed batch. Only a coordinator that finished the epoch itself asks (a
fenced one raised before), and it only ever deletes epochs far below the one it finished,
which no newer generation writes.
"""

from __future__ import annotations

from collections.abc import Sequence

from durable_sinks.core.errors import DurableSinkError
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.operations import ExpiringSink
from durable_sinks.core.protocol import SinkConnector

from ._metrics import EpochMetrics
from ._participants import brief
from ._watch import Watch

#: The sinks are asked every `retain_epochs // SPREAD` epochs: the window may overshoot by a
#: tenth, in exchange for one delete per tenth of the window instead of one per epoch.
SPREAD = 10


def expiry_interval(retain: int) -> int:
    """Every how many epochs the sinks are asked to expire (at least every epoch)."""
    return max(1, retain // SPREAD)


class SinkExpiry:
    """Asks the job's ExpiringSinks to delete their records of epochs beyond the window."""

    def __init__(self, sinks: Sequence[SinkConnector], retain: int, watch: Watch) -> None:
        self.sinks = [s for s in sinks if isinstance(s, ExpiringSink)]
        self.retain = retain
        self.every = expiry_interval(retain)
        self.watch = watch
        #: The first epoch whose finish asks the sinks again (None: the next one does).
        self._due: int | None = None

    def after(self, epoch: int, metrics: EpochMetrics, log: JobLogger) -> None:
        """After `epoch` committed everywhere: expire below `epoch - retain + 1` when due."""
        if not self.sinks or (self._due is not None and epoch < self._due):
            return
        self._due = epoch + self.every
        before = epoch - self.retain + 1
        if before <= 0:
            return
        for sink in self.sinks:
            try:
                with metrics.phase("finish"), self.watch.calling(sink.name, "expire_markers"):
                    sink.expire_markers(before)
            except DurableSinkError as exc:
                self._due = epoch + 1
                log.warning(
                    "the epoch committed, but expiring sink %s's records of epochs below %d "
                    "failed (%s); the next epoch tries again",
                    sink.name,
                    before,
                    brief(exc),
                )
