"""librdkafka's errors as the sink reads them: the KafkaError behind an exception, and the
codes that mean a newer producer took over the transactional.id. What each class of error
becomes (FencedError, TransientError, InDoubtError) is decided by the producer
(producer.py), which knows the transaction's state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

#: What every error of the sink names: the job, the sink and (when known) the epoch, as the
#: keyword arguments of a DurableSinkError.
Where = Callable[[int | None], dict[str, Any]]

#: librdkafka codes that mean a newer producer took over this transactional.id.
FENCED_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


def kafka_error_of(exc: BaseException) -> KafkaError | None:
    """The KafkaError behind `exc`: confluent-kafka raises KafkaException(KafkaError), and a
    producer call that fails inside a callback raises SystemError whose cause or context is
    the KafkaError itself (not an exception object)."""
    seen: Any = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, KafkaError):
            return seen
        if isinstance(seen, KafkaException) and seen.args and isinstance(seen.args[0], KafkaError):
            return seen.args[0]
        seen = getattr(seen, "__cause__", None) or getattr(seen, "__context__", None)
    return None
