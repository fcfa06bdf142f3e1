"""Records handed to librdkafka one record batch at a time: `rd_kafka_produce_batch` on the
confluent-kafka producer's own client, with every record's value, key and partition read
from the Arrow buffers (no Python object per record).

confluent-kafka has no call that takes many records without a Python object per record
(its `produce_batch` takes a list of dicts and is slower than a `produce()` loop), and its
`produce()` costs ~0.4 us a record, with the interpreter lock held, which is most of what
the driver spends on a batch after Spark hands it over (docs/benchmarks.md, Kafka).
librdkafka's own batch call enqueues 100,000 records in ~22 ms against the loop's ~45 ms,
and it runs without the interpreter lock.

Contract:
- `BulkProducer.of(producer)` is a bulk producer for exactly that producer's client, or None
  when this process cannot prove it has that client: the confluent-kafka major version is not
  one whose producer object starts with its `rd_kafka_t` pointer, the library the extension
  loaded does not report the version confluent-kafka reports, or the pointer's client does
  not hold the producer as its opaque (confluent-kafka sets it so). None means the caller
  produces record by record; nothing is guessed.
- `send` enqueues every record in order in the producer's open transaction, each to the
  partition the producer's partitioner chooses (librdkafka adds the partitions to the
  transaction as for `produce()`); records refused for a full queue are enqueued
  again from the first refused one (librdkafka refuses every record after a full queue, so
  order is kept and none is enqueued twice) after serving the producer for `wait_s`. A
  record refused for any other reason raises KafkaException with that record's error;
  records before it stay enqueued in the transaction, which the caller aborts.
- Records sent this way have no delivery callback of their own: a record the broker later
  refuses makes librdkafka mark the transaction as one that must be aborted, and
  `commit_transaction` reports that record's error (the caller reads it from there).
- Payloads and keys are copied by librdkafka before `send` returns (RD_KAFKA_MSG_F_COPY):
  the Arrow arrays may be released afterwards.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer

#: librdkafka's flag: copy the payload and key.
_F_COPY = 0x2
#: RD_KAFKA_PARTITION_UA: the partitioner chooses. Records with partitions of their own are
#: not sent this way: librdkafka's batch call with per-record partitions
#: (RD_KAFKA_MSG_F_PARTITION) adds its unassigned partition to the transaction while the
#: client has no metadata of the topic yet, and the transaction fails (librdkafka 2.x).
_PARTITIONER = -1
#: librdkafka's RD_KAFKA_RESP_ERR__QUEUE_FULL (queue.buffering.max.messages/kbytes reached).
_QUEUE_FULL = -184
#: confluent-kafka major versions whose producer object is PyObject_HEAD then rd_kafka_t*.
_KNOWN_MAJORS = frozenset({1, 2})


class _Message(ctypes.Structure):
    """librdkafka's rd_kafka_message_t (rdkafka.h), laid out by this platform's C rules."""

    _fields_ = (
        ("err", ctypes.c_int),
        ("rkt", ctypes.c_void_p),
        ("partition", ctypes.c_int32),
        ("payload", ctypes.c_void_p),
        ("len", ctypes.c_size_t),
        ("key", ctypes.c_void_p),
        ("key_len", ctypes.c_size_t),
        ("offset", ctypes.c_int64),
        ("_private", ctypes.c_void_p),
    )


#: The same layout as a numpy record, so a batch's messages are filled column by column.
_MESSAGES = np.dtype(_Message)


@dataclass(frozen=True)
class _Library:
    """The librdkafka functions of the client confluent-kafka's extension loaded."""

    produce_batch: Callable[..., int]
    topic_new: Callable[..., int | None]
    topic_destroy: Callable[..., None]
    opaque: Callable[..., int | None]


@cache
def _library() -> _Library | None:
    """librdkafka as confluent-kafka's extension loaded it (the wheel's bundled copy or the
    system's), or None when it cannot be found or is not the version confluent-kafka reports."""
    import confluent_kafka
    from confluent_kafka import cimpl

    if sys.implementation.name != "cpython":
        return None
    try:
        major = int(confluent_kafka.version()[0].split(".")[0])
        # dlsym on the extension's handle also searches the libraries it was linked with.
        lib = ctypes.CDLL(cimpl.__file__)
        lib.rd_kafka_version.restype = ctypes.c_int
        lib.rd_kafka_version.argtypes = []
        if major not in _KNOWN_MAJORS or lib.rd_kafka_version() != confluent_kafka.libversion()[1]:
            return None
        produce_batch = lib.rd_kafka_produce_batch
        produce_batch.restype = ctypes.c_int
        produce_batch.argtypes = (
            ctypes.c_void_p,
            ctypes.c_int32,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_int,
        )
        topic_new = lib.rd_kafka_topic_new
        topic_new.restype = ctypes.c_void_p
        topic_new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
        topic_destroy = lib.rd_kafka_topic_destroy
        topic_destroy.restype = None
        topic_destroy.argtypes = (ctypes.c_void_p,)
        opaque = lib.rd_kafka_opaque
        opaque.restype = ctypes.c_void_p
        opaque.argtypes = (ctypes.c_void_p,)
    except (OSError, AttributeError, ValueError, IndexError):
        return None
    return _Library(produce_batch, topic_new, topic_destroy, opaque)


def _client_of(producer: Producer, lib: _Library) -> int | None:
    """The producer's rd_kafka_t pointer, when its client holds the producer as its opaque."""
    # confluent-kafka's Handle: PyObject_HEAD, then `rd_kafka_t *rk` (NULL once closed).
    rk = ctypes.c_void_p.from_address(id(producer) + object.__basicsize__).value
    if not rk or rk % ctypes.alignment(ctypes.c_void_p):
        return None
    return rk if lib.opaque(rk) == id(producer) else None


_BINARY_LIKE = (pa.types.is_binary, pa.types.is_string)
_LARGE_BINARY_LIKE = (pa.types.is_large_binary, pa.types.is_large_string)
#: Where empty values point when their array has no data buffer at all.
_EMPTY = ctypes.create_string_buffer(1)
_EMPTY_ADDRESS = ctypes.addressof(_EMPTY)


def bulk_capable(array: pa.Array) -> bool:
    """Whether `array` (values or keys) is a type whose buffers `send` reads: binary, string,
    or their large forms."""
    return any(test(array.type) for test in (*_BINARY_LIKE, *_LARGE_BINARY_LIKE))


def _spans(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(address, length) of every element of a binary or string array; null: (0, 0)."""
    n = len(array)
    width = np.dtype(np.int64 if any(t(array.type) for t in _LARGE_BINARY_LIKE) else np.int32)
    buffers = array.buffers()
    offsets = np.frombuffer(
        buffers[1], dtype=width, count=n + 1, offset=array.offset * width.itemsize
    )
    data = buffers[2]
    # An empty value is not a null one (a tombstone): it must point somewhere.
    base = np.uint64(data.address if data is not None and data.address else _EMPTY_ADDRESS)
    addresses = base + offsets[:-1].astype(np.uint64)
    lengths = np.diff(offsets).astype(np.uint64)
    if array.null_count:
        nulls = array.is_null().to_numpy(zero_copy_only=False)
        addresses[nulls] = 0
        lengths[nulls] = 0
    return addresses, lengths


class BulkProducer:
    """`rd_kafka_produce_batch` on one confluent-kafka producer's client (module docstring)."""

    def __init__(self, producer: Producer, lib: _Library, client: int) -> None:
        self._producer = producer
        self._lib = lib
        self._client = client

    @classmethod
    def of(cls, producer: Producer) -> BulkProducer | None:
        lib = _library()
        if lib is None:
            return None
        client = _client_of(producer, lib)
        return None if client is None else cls(producer, lib, client)

    def send(
        self,
        topic: str,
        values: pa.Array,
        keys: pa.Array | None,
        *,
        wait_s: float,
        on_full: Callable[[], None],
    ) -> None:
        """Enqueue the records, each to the partition the producer's partitioner chooses
        (contract in the module docstring). `on_full` is called when the queue refused records
        and a wait of `wait_s` (serving the producer) made no room: it must raise."""
        n = len(values)
        if n == 0:
            return
        messages = np.zeros(n, dtype=_MESSAGES)
        messages["payload"], messages["len"] = _spans(values)
        if keys is not None:
            messages["key"], messages["key_len"] = _spans(keys)
        messages["partition"] = _PARTITIONER
        rkt = self._lib.topic_new(self._client, topic.encode(), None)
        if not rkt:
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, f"topic {topic!r}"))
        try:
            self._enqueue(rkt, messages, wait_s, on_full)
        finally:
            self._lib.topic_destroy(rkt)

    def _enqueue(
        self,
        rkt: int,
        messages: np.ndarray[Any, Any],
        wait_s: float,
        on_full: Callable[[], None],
    ) -> None:
        start, n, stalled = 0, len(messages), False
        base, size = messages.ctypes.data, messages.itemsize
        while start < n:
            good = self._lib.produce_batch(
                rkt, _PARTITIONER, _F_COPY, base + start * size, n - start
            )
            if good == n - start:
                return
            errors = messages["err"][start:]
            refused = np.flatnonzero(errors)
            other = refused[errors[refused] != _QUEUE_FULL]
            if len(other):
                index = start + int(other[0])
                code = int(messages["err"][index])
                raise KafkaException(KafkaError(code, f"record {index} of the batch was refused"))
            # A full queue: every record from the first refused one on was refused.
            first = start + int(refused[0])
            if first == start and stalled:
                on_full()
            stalled = first == start
            start = first
            self._producer.poll(wait_s)
