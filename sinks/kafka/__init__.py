"""Kafka: one transaction per epoch, a progress record carrying the decision, the job's last
resource (docs/kafka.md). `sink` holds the protocol's methods; `config`, `admin` (cluster
checks and offsets), `producer` (the transactional producer and what its errors mean),
`errors`, `records` (Arrow rows to Kafka records) and `progress` (the progress topic) the
pieces they use; `decisions` keeps a job's decisions and generations in the progress topic
when Kafka is the job's only sink.

Importing this package loads only the configuration (no client): `KafkaSink` loads
confluent-kafka when first used."""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_sinks.core.kinds import Deferred, SinkKind, deferred_members

from .config import Kafka

if TYPE_CHECKING:
    from .decisions import KafkaDecisionHost
    from .sink import KafkaSink

#: The kind `durable_sink("kafka", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("kafka", Kafka, Deferred(f"{__name__}.sink", "KafkaSink"))

__getattr__ = deferred_members(__name__, {"KafkaSink": ".sink", "KafkaDecisionHost": ".decisions"})

__all__ = ["KIND", "Kafka", "KafkaDecisionHost", "KafkaSink"]
