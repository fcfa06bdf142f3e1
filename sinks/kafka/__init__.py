"""Kafka: one transaction per epoch, a progress record carrying the decision, the job's last
resource (docs/kafka.md). `sink` holds the protocol's methods; `config`, `admin` (cluster
checks and offsets), `producer` (the transactional producer and what its errors mean),
`errors`, `records` (Arrow rows to Kafka records) and `progress` (the progress topic) the
pieces they use; `decisions` keeps a job's decisions and generations in the progress topic
when Kafka is the job's only sink."""

from durable_sinks.core.kinds import SinkKind

from .config import KafkaSinkConfig
from .decisions import KafkaDecisionHost
from .sink import KafkaSink

#: The kind `durable_sink("kafka", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("kafka", KafkaSinkConfig, KafkaSink)

__all__ = ["KIND", "KafkaDecisionHost", "KafkaSink", "KafkaSinkConfig"]
