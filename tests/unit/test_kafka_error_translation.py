"""Every librdkafka failure of every path of the Kafka sink comes out typed: the
transactional producer's calls (init, begin, produce, flush, delivery reports, commit, abort),
the admin calls (offsets) and the progress-topic reads, and a last guard around every protocol
method. librdkafka is replaced by fakes that raise what the real one raises (the codes were
measured against the test bed's broker: see tests/integration/test_kafka_faults.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    FencedError,
    InDoubtError,
    TransientError,
    UnreachableError,
)
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.protocol import CommitHandle, OpenContext
from durable_sinks.sinks.kafka import Kafka, KafkaSink, admin, sink
from durable_sinks.sinks.kafka.admin import ATTEMPT_TIMEOUT_S, Cluster
from durable_sinks.sinks.kafka.progress import ProgressReader
from durable_sinks.sinks.kafka.records import build_records
from durable_sinks.sinks.kafka.timeouts import TransactionTimeout
from durable_sinks.sinks.kafka.writer import KafkaParticipant, TransactionalProducer

Outcome = BaseException | None


def kafka(code: int, *, fatal: bool = False, retriable: bool = False, abort: bool = False) -> Any:
    return KafkaException(
        KafkaError(code, "measured", fatal=fatal, retriable=retriable, txn_requires_abort=abort)
    )


RETRIABLE = kafka(KafkaError._TIMED_OUT, retriable=True)
FENCED = kafka(KafkaError._FENCED, fatal=True)
ABORTABLE = kafka(KafkaError._INCONSISTENT, abort=True)


def system_error(cause: BaseException | None) -> SystemError:
    error = SystemError("<built-in method> returned a result with an exception set")
    error.__cause__ = cause
    return error


class FakeProducer:
    """librdkafka's Producer, each call failing with the next scripted outcome (then
    succeeding)."""

    def __init__(self, **script: list[Outcome]) -> None:
        self.script = script
        self.calls: dict[str, int] = {}

    def _next(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        outcomes = self.script.get(name, [])
        outcome = outcomes.pop(0) if len(outcomes) > 1 else (outcomes[0] if outcomes else None)
        if outcome is not None:
            raise outcome

    def init_transactions(self, timeout: float) -> None:
        self._next("init_transactions")

    def begin_transaction(self) -> None:
        self._next("begin_transaction")

    def commit_transaction(self, timeout: float) -> None:
        self._next("commit_transaction")

    def abort_transaction(self, timeout: float) -> None:
        self._next("abort_transaction")

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self._next("produce")

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        self._next("flush")
        return 0

    def close(self) -> None:
        pass


def config() -> Kafka:
    return Kafka(
        "127.0.0.1:1",
        "events",
        request_timeout_s=0.4,
        transaction_timeout_s=3.0,
    )


def where(epoch: int | None) -> dict[str, Any]:
    return {"job": "job", "sink": "kafka", "epoch": epoch}


def producer(
    fake: FakeProducer, *, age: float | None = None, newer_owner: bool = False
) -> TransactionalProducer:
    """A TransactionalProducer over `fake`, its open transaction's first record `age`
    seconds old."""
    made = TransactionalProducer(
        config(),
        "ds:job:kafka",
        where,
        JobLogger("job", "kafka", component="sinks.kafka"),
        newer_owner=lambda: newer_owner,
    )
    made._producer = fake  # type: ignore[assignment]
    if age is not None:
        made._first_record = time.monotonic() - age
    return made


def send(made: TransactionalProducer) -> None:
    records = build_records(pa.record_batch({"n": [1]}), config().layout, 0)
    made.send(records, 0, "events")


# (path, script, age of the transaction, a newer generation holds the fence, expected)
CASES: dict[str, tuple[Callable[[TransactionalProducer], Any], dict[str, list[Outcome]], Any]] = {
    "init: retriable until the time-out": (
        lambda p: p.call("init_transactions", p.require().init_transactions),
        {"init_transactions": [RETRIABLE]},
        UnreachableError,
    ),
    "init: credentials refused": (
        lambda p: p.call("init_transactions", p.require().init_transactions),
        {"init_transactions": [kafka(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)]},
        ConfigError,
    ),
    "init: transaction time-out above the broker's limit": (
        lambda p: p.call("init_transactions", p.require().init_transactions),
        {"init_transactions": [kafka(KafkaError.INVALID_TRANSACTION_TIMEOUT)]},
        ConfigError,
    ),
    "begin: fenced": (lambda p: p.begin(0), {"begin_transaction": [FENCED]}, FencedError),
    "begin: erroneous state": (
        lambda p: p.begin(0),
        {"begin_transaction": [kafka(KafkaError._STATE)]},
        TransientError,
    ),
    "produce: erroneous state": (send, {"produce": [kafka(KafkaError._STATE)]}, TransientError),
    "produce: queue full": (send, {"produce": [BufferError("Local: Queue full")]}, TransientError),
    "produce: fenced inside a callback": (send, {"produce": [system_error(FENCED)]}, FencedError),
    "flush: fenced inside a callback": (
        lambda p: p.flush(0),
        {"flush": [system_error(FENCED)]},
        FencedError,
    ),
    "flush: SystemError with no cause": (
        lambda p: p.flush(0),
        {"flush": [system_error(None)]},
        TransientError,
    ),
    "commit: retriable until the time-out": (
        lambda p: p.commit(0),
        {"commit_transaction": [RETRIABLE]},
        InDoubtError,
    ),
    "commit: needs an abort": (
        lambda p: p.commit(0),
        {"commit_transaction": [ABORTABLE]},
        TransientError,
    ),
    # the EndTxn may have committed before the fence: test_an_epochs_commit_fenced_is_in_doubt
    "commit: fenced": (lambda p: p.commit(0), {"commit_transaction": [FENCED]}, InDoubtError),
    "commit: another fatal error": (
        lambda p: p.commit(0),
        {"commit_transaction": [kafka(KafkaError._FATAL, fatal=True)]},
        InDoubtError,
    ),
    "commit: SystemError with no cause": (
        lambda p: p.commit(0),
        {"commit_transaction": [system_error(None)]},
        InDoubtError,
    ),
    "abort: retriable until the time-out": (
        lambda p: p.abort(0),
        {"abort_transaction": [RETRIABLE]},
        UnreachableError,
    ),
    "abort: fenced": (lambda p: p.abort(0), {"abort_transaction": [FENCED]}, FencedError),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_producer_failure_is_typed(case: str) -> None:
    call, script, expected = CASES[case]
    made = producer(FakeProducer(**{k: list(v) for k, v in script.items()}), age=0.0)
    with pytest.raises(expected) as raised:
        call(made)
    assert type(raised.value) is expected
    assert raised.value.job == "job"
    assert raised.value.sink == "kafka"


@pytest.mark.parametrize("call", ["init_transactions", "commit_transaction", "abort_transaction"])
def test_a_retriable_failure_is_retried_in_place(call: str) -> None:
    fake = FakeProducer(**{call: [RETRIABLE, RETRIABLE, None]})
    made = producer(fake, age=0.0)
    calls: dict[str, Callable[[], Any]] = {
        "init_transactions": lambda: made.call("init_transactions", fake.init_transactions),
        "commit_transaction": lambda: made.commit(0),
        "abort_transaction": lambda: made.abort(0),
    }
    calls[call]()
    assert fake.calls[call] == 3


def test_a_conflicting_call_is_not_retried() -> None:
    fake = FakeProducer(abort_transaction=[kafka(KafkaError._CONFLICT, retriable=True)])
    with pytest.raises(TransientError):
        producer(fake, age=0.0).abort(0)
    assert fake.calls["abort_transaction"] == 1


@pytest.mark.parametrize(
    "path",
    ["abort", "flush", "produce", "delivery report"],
)
def test_a_transaction_the_broker_timed_out_is_transient_not_fenced(path: str) -> None:
    """librdkafka reports a transaction the broker timed out as fatal _FENCED, like a real
    fence: older than transaction.timeout.ms and no newer generation in the fence record,
    it is a retriable TransientError, and the producer is replaced at the next epoch. (Not
    at an epoch's commit: test_an_epochs_commit_fenced_is_in_doubt.)"""
    fake = FakeProducer(
        commit_transaction=[FENCED],
        abort_transaction=[FENCED],
        flush=[system_error(FENCED)],
        produce=[FENCED],
    )
    made = producer(fake, age=4.0)
    if path == "delivery report":
        made._on_delivery_error(KafkaError(KafkaError.INVALID_PRODUCER_EPOCH), None)
    call: Callable[[], Any] = {
        "commit": lambda: made.commit(0),
        "abort": lambda: made.abort(0),
        "flush": lambda: made.flush(0),
        "produce": lambda: send(made),
        "delivery report": lambda: made.check_delivery(0),
    }[path]
    with pytest.raises(TransientError, match=r"transaction\.timeout\.ms") as raised:
        call()
    assert type(raised.value) is TransientError
    assert "transaction_timeout_s" in (raised.value.fix or "")
    assert made.broken
    assert made.fenced is None
    assert made.abort(0) is False  # a broken producer's transaction dies with it


def test_an_old_transaction_fenced_by_a_newer_generation_is_fenced() -> None:
    made = producer(FakeProducer(flush=[system_error(FENCED)]), age=4.0, newer_owner=True)
    with pytest.raises(FencedError):
        made.flush(0)
    with pytest.raises(FencedError):  # remembered
        made.begin(1)


@pytest.mark.parametrize(("age", "newer_owner"), [(0.0, True), (4.0, False), (4.0, True)])
def test_an_epochs_commit_fenced_is_in_doubt(age: float, newer_owner: bool) -> None:
    """A fence met by an epoch's EndTxn says nothing of the commit (the request may have
    committed before the fence, its answer lost): InDoubtError, whether a newer generation
    or the broker's time-out fenced it, and the producer is done."""
    made = producer(FakeProducer(commit_transaction=[FENCED]), age=age, newer_owner=newer_owner)
    with pytest.raises(InDoubtError, match="commit_transaction was fenced") as raised:
        made.commit(0)
    assert raised.value.retriable
    assert "progress topic" in (raised.value.fix or "")
    assert ("transaction_timeout_s" in (raised.value.fix or "")) is (age > 3.0)
    assert made.broken
    assert made.abort(0) is False


def test_the_fence_records_own_commit_fenced_is_fenced() -> None:
    """The sink's own records (epoch None: the fence record) are never in doubt."""
    made = producer(FakeProducer(commit_transaction=[FENCED]), age=0.0, newer_owner=True)
    with pytest.raises(FencedError):
        made.commit(None)


def test_an_unreadable_fence_record_counts_as_a_time_out() -> None:
    """A time-out is retried, and the retry's open reads the fence record again."""

    def unreadable() -> bool:
        raise UnreachableError("the cluster is down")

    made = producer(FakeProducer(flush=[system_error(FENCED)]), age=4.0)
    made._newer_owner = unreadable
    with pytest.raises(TransientError, match=r"transaction\.timeout\.ms"):
        made.flush(0)


def test_delivery_reports_are_typed() -> None:
    made = producer(FakeProducer(), age=0.0)
    made._on_delivery_error(KafkaError(KafkaError._MSG_TIMED_OUT), None)
    with pytest.raises(TransientError, match="_MSG_TIMED_OUT"):
        made.check_delivery(0)


# -- admin and progress reads ---------------------------------------------------------------------
class FakeFuture:
    def __init__(self, outcome: Outcome, offset: int) -> None:
        self.outcome = outcome
        self.offset = offset

    def result(self, timeout: float | None = None) -> Any:
        if self.outcome is not None:
            raise self.outcome
        return self


class FakeAdmin:
    def __init__(self, outcomes: list[Outcome], *, scan: bool = False) -> None:
        self.outcomes = outcomes
        self.scan = scan
        self.calls = 0
        #: Each attempt's request_timeout, and the topics whose metadata was asked again.
        self.request_timeouts: list[float] = []
        self.refreshed: list[str | None] = []

    def list_offsets(self, partitions: dict[TopicPartition, Any], **kwargs: Any) -> Any:
        self.calls += 1
        self.request_timeouts.append(kwargs["request_timeout"])
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        # A partition's start is 0, its end 7 (a progress read asks for both, in turn).
        offset = 0 if self.calls % 2 and self.scan else 7
        return {p: FakeFuture(outcome, offset) for p in partitions}

    def poll(self, timeout: float) -> int:
        return 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
        self.refreshed.append(topic)


NO_LEADERS = kafka(KafkaError._NOENT)  # "Failed to query partition leaders: No leaders found"


#: The one partition of the topic the clusters below read.
EVENTS = [TopicPartition("events", 0)]


def cluster(fake: FakeAdmin) -> Cluster:
    made = Cluster.__new__(Cluster)
    made.config, made.admin, made.where = config(), fake, where  # type: ignore[assignment]
    made._timeout = 0.4
    return made


def test_no_leaders_found_after_a_broker_restart_is_retried() -> None:
    """The incident: list_offsets right before the commit point raised a raw KafkaException
    "No leaders found" (_NOENT) 0.8 s after the broker came back."""
    fake = FakeAdmin([NO_LEADERS, NO_LEADERS, None])
    assert cluster(fake).high_watermarks(EVENTS, 0) == {TopicPartition("events", 0): 7}
    assert fake.calls == 3


def test_a_retry_asks_for_fresh_metadata_and_no_attempt_waits_past_its_bound() -> None:
    """A cluster's partition leader killed: the admin client keeps the metadata it last
    learnt (the dead leader, or none) until it ages out in minutes, and a request sent to the
    dead broker waits its whole time-out. Each retry asks for the topic's metadata again, and
    one attempt waits ATTEMPT_TIMEOUT_S at most, so the offsets come seconds after the
    election, not at the end of request_timeout_s (a leader killed before the decision
    paused a batch 30-37 s before)."""
    fake = FakeAdmin([NO_LEADERS, NO_LEADERS, None])
    made = cluster(fake)
    made._timeout = 60.0
    assert made.high_watermarks(EVENTS, 0) == {TopicPartition("events", 0): 7}
    assert fake.refreshed == ["events", "events"]
    assert len(fake.request_timeouts) == 3
    assert max(fake.request_timeouts) <= ATTEMPT_TIMEOUT_S


def test_the_early_offset_read_waits_one_attempt_at_most_then_asks_with_fresh_metadata() -> None:
    """The replicated soak's pause: the partition leader killed between two epochs, the
    offset read sent at the next epoch's begin went to the dead broker and waited out the
    whole request_timeout_s (30 s) before the pre-commit asked again. It waits one attempt
    (ATTEMPT_TIMEOUT_S) at most; the read asked again first refreshes the topic's metadata."""
    fake = FakeAdmin([NO_LEADERS, None])
    made = cluster(fake)
    made._timeout = 60.0
    soon = made.high_watermarks_soon(EVENTS, 0)
    assert soon() == {TopicPartition("events", 0): 7}
    assert fake.refreshed == ["events"]
    assert fake.request_timeouts == [ATTEMPT_TIMEOUT_S, ATTEMPT_TIMEOUT_S]


class MovingLeaderAdmin(FakeAdmin):
    """Answers its first `invalid` calls with OFFSET_INVALID (-1001) and no error, as
    list_offsets did while a killed broker's partitions moved to another leader."""

    def __init__(self, invalid: int) -> None:
        super().__init__([None])
        self.invalid = invalid

    def list_offsets(self, partitions: dict[TopicPartition, Any], **kwargs: Any) -> Any:
        answer = super().list_offsets(partitions, **kwargs)
        if self.calls <= self.invalid:
            return {p: FakeFuture(None, -1001) for p in partitions}
        return answer


def test_an_answer_without_an_offset_is_asked_again_never_taken_as_an_offset() -> None:
    """The incident (the replicated soak, a broker SIGKILLed mid-epoch): the high watermark
    came back as -1001 without an error and the progress record named the range
    [3057, -1001), which every later start refused as unreadable (the job wedged)."""
    fake = MovingLeaderAdmin(invalid=2)
    assert cluster(fake).high_watermarks(EVENTS, 0) == {TopicPartition("events", 0): 7}
    assert fake.calls == 3
    soon = cluster(MovingLeaderAdmin(invalid=1)).high_watermarks_soon(EVENTS, 0)
    assert soon() == {TopicPartition("events", 0): 7}
    with pytest.raises(TransientError, match="no offset for events\\[0\\]") as raised:
        cluster(MovingLeaderAdmin(invalid=10**6)).high_watermarks(EVENTS, 4)
    assert raised.value.epoch == 4


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (NO_LEADERS, TransientError),
        (kafka(KafkaError._TIMED_OUT), UnreachableError),
        (kafka(KafkaError.TOPIC_AUTHORIZATION_FAILED), ConfigError),
    ],
)
def test_offsets_failures_are_typed(
    outcome: BaseException, expected: type[DurableSinkError]
) -> None:
    with pytest.raises(expected) as raised:
        cluster(FakeAdmin([outcome])).high_watermarks(EVENTS, 3)
    assert type(raised.value) is expected
    assert raised.value.epoch == 3


class FailingConsumer:
    def assign(self, partitions: Any) -> None:
        raise kafka(KafkaError._TRANSPORT)

    def unassign(self) -> None:
        pass

    def close(self) -> None:
        raise RuntimeError("Consumer closed")


@pytest.mark.parametrize("failing", ["offsets", "consumer"])
def test_progress_reads_are_typed(failing: str) -> None:
    fake = FakeAdmin([NO_LEADERS] if failing == "offsets" else [None], scan=True)
    reader = ProgressReader(
        fake,  # type: ignore[arg-type]
        {},
        "events-ds-progress",
        0.3,
        lambda: where(None),
        request_timeout=0.3,
    )
    reader._consumers["read_committed"] = FailingConsumer()  # type: ignore[assignment]
    with pytest.raises(TransientError) as raised:
        reader.latest({b"key": lambda value, offset: True})
    assert raised.value.job == "job"
    reader.close()  # a consumer that fails to close is dropped quietly


# -- the last guard around every protocol method --------------------------------------------------
HANDLE = CommitHandle(
    "kafka", 0, str(OpenContext("job", "kafka", 1).participant(0, 0)), 1, 1, "crc32:0", {}
)
METHODS: dict[str, Callable[[KafkaSink], Any]] = {
    "open": lambda s: s.open(OpenContext("job", "kafka", 1)),
    "health_check": lambda s: s.health_check(),
    "begin_epoch": lambda s: s.begin_epoch(0),
    "write_batch": lambda s: s.write_batch(pa.record_batch({"n": [1]})),
    "pre_commit": lambda s: s.pre_commit(0),
    "commit_with_decision": lambda s: s.commit_with_decision(0, HANDLE, {}),
    "commit_epoch": lambda s: s.commit_epoch(0, HANDLE),
    "rollback_epoch": lambda s: s.rollback_epoch(0, HANDLE),
    "recover_prepared": lambda s: s.recover_prepared(),
    "last_committed_epoch": lambda s: s.last_committed_epoch(),
    "read_decision": lambda s: s.read_decision(0),
}


@pytest.mark.parametrize("raw", ["KafkaException", "SystemError", "BufferError"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_no_raw_client_error_leaves_a_protocol_method(
    method: str, raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    error: BaseException = {
        "KafkaException": kafka(KafkaError._TRANSPORT),
        "SystemError": system_error(None),
        "BufferError": BufferError("Local: Queue full"),
    }[raw]

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(sink, "_Opened", fail)
    monkeypatch.setattr(KafkaSink, "_state", fail)
    target = KafkaSink(config())
    name = OpenContext("job", "kafka", 1).participant(0, 0)
    target._current = KafkaParticipant(0, name)
    target._current.prepared = HANDLE
    with pytest.raises(DurableSinkError) as raised:
        METHODS[method](target)
    at_commit_point = method in ("commit_with_decision", "commit_epoch")
    assert isinstance(raised.value, InDoubtError if at_commit_point else TransientError)


def test_list_offsets_raises_its_error_for_callers_to_type() -> None:
    """The module function stays raw (tests read offsets with it); the sink types it."""
    with pytest.raises(KafkaException):
        admin.list_offsets(FakeAdmin([kafka(KafkaError._STATE)]), [TopicPartition("t", 0)], 0, 0.2)  # type: ignore[arg-type]


def test_a_bare_failure_of_a_producer_a_newer_generation_fenced_is_fenced() -> None:
    """librdkafka may fail a flush inside a callback with no exception and no delivery report
    (a producer fenced while adding a partition to the transaction): the fence record,
    read back, tells a fence from a transient failure."""
    bare = SystemError("<method 'flush' of 'cimpl.Producer' objects> returned NULL")
    fenced = producer(FakeProducer(flush=[bare]), age=0.0, newer_owner=True)
    with pytest.raises(FencedError, match="a newer generation of the job took over"):
        fenced.flush(0)
    alone = producer(FakeProducer(flush=[bare]), age=0.0, newer_owner=False)
    with pytest.raises(TransientError, match="flushing records failed"):
        alone.flush(0)
    # With no newer owner, a transaction older than transaction.timeout.ms was the broker's
    # time-out (it bumped the producer epoch): the time-out's retriable error and its fix.
    timed_out = producer(FakeProducer(flush=[bare]), age=999.0, newer_owner=False)
    with pytest.raises(TransientError, match=r"open longer than transaction\.timeout\.ms") as hit:
        timed_out.flush(0)
    assert "transaction_timeout_s" in (hit.value.fix or "")
    assert timed_out.broken


def derived_producer(fake: FakeProducer, *, age: float, ceiling: float) -> TransactionalProducer:
    """A producer whose timeout is derived (no transaction_timeout_s), started at 60 s with
    `ceiling` the longest it may take."""
    made = producer(fake, age=age)
    chooser = TransactionTimeout(explicit_s=None)
    chooser.bounded(ceiling, stored_open_s=1.0)  # measured: 4 x 1 s -> the 60 s rung
    made.timeouts = chooser
    made.started_timeout_s = chooser.current_s or 0.0
    return made


def test_a_derived_timeout_the_broker_enforced_takes_the_ceiling_next() -> None:
    """The broker aborted a transaction that outlived a derived timeout below the ceiling:
    retriable, and the next attempt's producer takes the ceiling (never the same timeout
    again)."""
    made = derived_producer(FakeProducer(flush=[system_error(FENCED)]), age=61.0, ceiling=900.0)
    assert made.started_timeout_s == 60.0
    with pytest.raises(
        TransientError, match="the next attempt uses a transaction timeout of 900 s"
    ):
        made.flush(0)
    assert made.timeouts is not None
    assert made.timeouts.current_s == 900.0
    assert made.broken


def test_a_batch_longer_than_the_ceiling_is_a_config_error_naming_both() -> None:
    """The broker aborted a transaction whose timeout was already the ceiling: no attempt
    can commit such a batch, so it is not retried (ConfigError with the measured age, the
    limit and the fix)."""
    made = derived_producer(FakeProducer(flush=[system_error(FENCED)]), age=61.0, ceiling=900.0)
    made.timeouts = TransactionTimeout()
    made.timeouts.bounded(60.0, stored_open_s=None)  # the ceiling is 60 s
    made.started_timeout_s = 60.0
    with pytest.raises(ConfigError, match=r"first record is 61\.\d s old") as raised:
        made.flush(0)
    assert not raised.value.retriable
    assert "already the longest transaction timeout" in raised.value.message
    assert "transaction.max.timeout.ms" in (raised.value.fix or "")
    with pytest.raises(ConfigError):  # asked again of the same producer: the same answer
        made.flush(0)


def test_socket_timeout_never_exceeds_the_transaction_timeout() -> None:
    """librdkafka refuses socket.timeout.ms above transaction.timeout.ms + 100 ms and raises
    it to the transaction timeout when not given: the sink gives 60 s at most."""
    made = producer(FakeProducer())
    made.transaction_timeout_s = 900.0
    assert made.settings()["socket.timeout.ms"] == 60_000
    made.transaction_timeout_s = 3.0
    assert made.settings()["socket.timeout.ms"] == 3_000
