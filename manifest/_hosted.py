"""A decision store kept by the job's only sink: the decisions are the sink's own commits.

A sink that is a job's commit point carries each epoch's decision record in its commit (a
`LastResource`: Kafka's progress record). When it is the job's only sink, nothing else needs
the decision, so the store only has to fence generations and read decisions back, and the
sink's target can do both (a `DecisionHost`, offered by the sink: a decision store never
imports a sink). This store adapts such a host to the DecisionStore protocol.

What is durable when: a decision is durable exactly when the sink's `commit_with_decision`
returned; `put` writes nothing (see `put`); generations are durable when `open` returns, with
the compare-and-swap and fencing the host's `claim_generation` documents. Records are kept as
long as the sink keeps its commit records (`expire` deletes nothing): the latest one always.
"""

from __future__ import annotations

from durable_sinks.core.errors import UsageError
from durable_sinks.core.operations import Bookkeeping
from durable_sinks.core.protocol import DecisionHost

from ._record import DecisionRecord
from ._store import require_open


class HostedDecisionStore:
    """The DecisionStore of a job whose only sink keeps its decisions (`host`). The
    coordinator never copies decisions into it: the sink's commits are the records."""

    def __init__(self, host: DecisionHost) -> None:
        self.host = host
        self._job: str | None = None

    def __repr__(self) -> str:
        return f"HostedDecisionStore(sink={self.sink!r})"

    @property
    def sink(self) -> str:
        """The name of the sink whose commits carry the decisions."""
        return self.host.sink

    @property
    def durable(self) -> bool:
        return True

    def open(self, job_id: str) -> int:
        generation = self.host.claim_generation(job_id)
        self._job = job_id
        return generation

    def peek_generation(self, job_id: str) -> int:
        return self.host.newest_generation(job_id)

    def put(self, record: DecisionRecord) -> DecisionRecord:
        """The decision the sink's commit of `record.epoch` carried (it won: it is the commit
        point). UsageError when that epoch has no commit: only the sink's commit decides."""
        job = require_open(self._job)
        found = self.peek(job, record.epoch)
        if found is None:
            raise UsageError(
                f"this job's decisions are the commits of its sink {self.sink!r}: a decision "
                f"for epoch {record.epoch} cannot be written apart from that commit",
                job=job,
                epoch=record.epoch,
                fix="give the job a decision_store when it writes to more than this one sink",
            )
        return found

    def get(self, epoch: int) -> DecisionRecord | None:
        return self.peek(require_open(self._job), epoch)

    def mark_finished(self, epoch: int) -> None:
        """Nothing to record: the sink's commit finished the epoch."""
        require_open(self._job)

    def is_finished(self, epoch: int) -> bool:
        return self.get(epoch) is not None

    def latest_epoch(self) -> int | None:
        return self.peek_latest(require_open(self._job))

    def expire(self, before_epoch: int) -> int:
        """Nothing to delete: the sink keeps (and compacts) its own commit records."""
        require_open(self._job)
        return 0

    def peek(self, job_id: str, epoch: int) -> DecisionRecord | None:
        carried = self.host.decision(job_id, epoch)
        if carried is None:
            return None
        return DecisionRecord.from_json(carried, source=f"{self.sink} commit")

    def peek_latest(self, job_id: str) -> int | None:
        return self.host.latest_decided(job_id)

    def drop_job(self, job_id: str, *, apply: bool) -> list[Bookkeeping]:
        """Nothing of its own: the generations and decisions are the sink's records, removed
        by the sink's own drop."""
        return [
            Bookkeeping(
                "generations and decisions",
                f"sink {self.sink}",
                kept=f"they are sink {self.sink}'s records: its drop removes them",
            )
        ]

    def close(self) -> None:
        self.host.close()
