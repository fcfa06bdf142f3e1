"""What a Kafka participant's commit handle holds (typed and versioned, core/handles.py).

A Kafka transaction cannot be resumed from a handle (it dies with its producer: the sink is
the job's last resource), so the details only say where the epoch went, for audits and the
operator's tools: the producer's transactional.id, the topics, the progress topic; or, for an
open transaction an operator's tool found, what it is."""

from __future__ import annotations

from dataclasses import dataclass

from durable_sinks.core.handles import HandleDetails


@dataclass(frozen=True)
class KafkaHandleDetails(HandleDetails):
    """Where a Kafka participant's records went (empty for a transaction found open)."""

    transactional_id: str = ""
    #: Every topic the epoch wrote records into.
    topics: tuple[str, ...] = ()
    progress_topic: str = ""
    #: What an operator's tool found (an open transaction), instead of a prepared epoch.
    note: str | None = None
