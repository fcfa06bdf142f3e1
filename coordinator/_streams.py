"""Which stream a job's epochs come from, and where a new stream's epochs begin.

A job's epochs come from one stream at a time (a Spark query, named by its id, which the
query's checkpoint keeps across restarts). A stream's batch b is the job's epoch
`first_epoch + b`; the first stream's `first_epoch` is 0. A query restarted from a new
checkpoint (deleted, corrupted, moved, or a new one for a reprocessing) is a new stream whose
batch ids start at 0 again: it continues the job only when it is told to start after the
job's newest epoch (`first_epoch = newest + 1`), so that none of its batches is taken for a
replay of the old stream's epochs and the old stream's rows are neither written again nor
lost from the sinks.

Checked once per coordinator, at the first epoch it runs with its stream known (one decision
read): against the job's newest decision N (it carries its stream and that stream's
`first_epoch`; a record without `first_epoch` means 0):
- no decision yet: nothing to check (a fresh job);
- N is of this stream: `first_epoch` must be the one the stream started with
  (ConfigError otherwise: its batches would land on other epochs than before);
- N is of another stream: this stream is new to the job, and `first_epoch` must be N + 1
  (EpochOrderError otherwise, naming the value);
- N names no stream (written with the stream unknown): `first_epoch` must be N's or N + 1,
  as nothing tells whether this stream wrote N.
Not checked at least once (no decisions), nor with the stream unknown (the replay check by
rows then guards a decided epoch).
"""

from __future__ import annotations

from durable_sinks.core.errors import ConfigError, EpochOrderError
from durable_sinks.core.joblog import JobLogger
from durable_sinks.manifest import DecisionRecord

from ._decisions import DecisionBook

#: Where users read how to move a job to a new checkpoint.
NEW_CHECKPOINT_DOC = "docs/operations.md#moving-a-job-to-a-new-checkpoint"


def started_at(record: DecisionRecord) -> int:
    """The first epoch of the stream `record` holds data of (0 for a record that predates
    the field)."""
    return 0 if record.first_epoch is None else record.first_epoch


class StreamCheck:
    """The check of one coordinator run (module docstring): `at_epoch` before each epoch; it
    checks the first epoch that has its stream known, then nothing more."""

    def __init__(self, job_id: str, decisions: DecisionBook, first_epoch: int) -> None:
        if first_epoch < 0:
            raise ConfigError(
                f"first_epoch must be >= 0, not {first_epoch}",
                job=job_id,
                fix="leave it out (0) for a job's first stream; a stream started from a new "
                "checkpoint starts after the job's newest epoch (the error that stops it "
                "names the value)",
            )
        self.job_id = job_id
        self.decisions = decisions
        self.first_epoch = first_epoch
        self._pending = True

    def at_epoch(self, epoch: int, source: str | None, log: JobLogger) -> None:
        """Check that `source`'s batches land where they did before, or right after the job's
        newest epoch for a stream new to the job; `epoch` is the one about to run."""
        if not self._pending or source is None:
            return
        newest = self.decisions.newest_at_start()
        if newest is None:
            self._pending = False
            return
        record = self.decisions.decision(newest)
        if record is None:  # (a commit point that no longer answers for it: nothing to compare)
            log.debug("the newest epoch %d has no readable decision: stream not checked", newest)
            self._pending = False
            return
        if record.source == source:
            self._same_stream(record, source, epoch)
        elif record.source is not None or self.first_epoch not in (started_at(record), newest + 1):
            self._new_stream(record, source, epoch, log)
        self._pending = False

    def _same_stream(self, record: DecisionRecord, source: str, epoch: int) -> None:
        started = started_at(record)
        if started == self.first_epoch:
            return
        raise ConfigError(
            f"stream {source!r} started at epoch {started} (its batch b is epoch {started} + b) "
            f"and wrote up to epoch {record.epoch}; with first_epoch={self.first_epoch} its "
            f"batch {epoch - self.first_epoch} would be epoch {epoch}. Nothing of this batch "
            "was written",
            job=self.job_id,
            epoch=epoch,
            fix=f"keep first_epoch={started} for as long as this query runs from this checkpoint",
        )

    def _new_stream(self, record: DecisionRecord, source: str, epoch: int, log: JobLogger) -> None:
        newest = record.epoch
        if self.first_epoch == newest + 1:
            log.info(
                "stream %r is new to the job: it starts at epoch %d, after epoch %d of %s",
                source,
                self.first_epoch,
                newest,
                "an unnamed stream" if record.source is None else f"stream {record.source!r}",
            )
            return
        earlier = "an unnamed stream" if record.source is None else f"stream {record.source!r}"
        if self.first_epoch == 0:
            why = (
                "the query's checkpoint was deleted, reset or moved (Spark gives the query a "
                "new id and starts its batch ids at 0 again), or another query writes under "
                "the same job id"
            )
        else:
            why = (
                f"first_epoch={self.first_epoch} does not continue the job: a stream new to "
                f"the job starts right after its newest epoch"
            )
        raise EpochOrderError(
            f"this batch comes from stream {source!r}, which the job has not seen: its newest "
            f"epoch, {newest}, holds data of {earlier}; {why}. Nothing of this batch was "
            "written",
            job=self.job_id,
            epoch=epoch,
            fix=f"if this query continues the job from a new checkpoint, or reprocesses its "
            f"source on purpose, start it with durable_sink(..., first_epoch={newest + 1}) "
            f"(its batch b becomes epoch {newest + 1} + b; keep the option while it runs; "
            f"see {NEW_CHECKPOINT_DOC}); otherwise restore the query's own checkpoint, or give "
            "the other query its own job_id",
        )
