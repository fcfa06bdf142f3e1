"""Kafka: one transaction per epoch, a progress record carrying the decision, the job's last
resource (docs/kafka.md). `sink` holds the protocol's methods; `config`, `admin` (cluster
checks and offsets), `producer` (the transactional producer and what its errors mean),
`errors`, `records` (Arrow rows to Kafka records) and `progress` (the progress topic) the
pieces they use.

Importing this package loads only the configuration (no client): `KafkaSink` loads
confluent-kafka when first used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import Kafka, KafkaSinkConfig

if TYPE_CHECKING:
    from .sink import KafkaSink


def __getattr__(name: str) -> Any:
    if name == "KafkaSink":
        from .sink import KafkaSink

        return KafkaSink
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Kafka", "KafkaSink", "KafkaSinkConfig"]
