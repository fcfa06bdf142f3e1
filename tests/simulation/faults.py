"""Ambiguous outcomes injected into the real clients of a simulated job.

Every state-changing call the job makes to a server or a disk goes through one `Faults`
plan, in the order the calls are made: Postgres' PREPARE TRANSACTION, COMMIT PREPARED,
ROLLBACK PREPARED and COMMIT; Kafka's init_transactions, commit_transaction and
abort_transaction (EndTxn); S3's PutObject (markers, decisions), CompleteMultipartUpload,
AbortMultipartUpload and deletes; the local directory store's and the files sink's links,
renames, removals and exclusive creations. The plan counts them and makes one of them (its
`target`, counted from 1) fail in one of two ways:

- `Outcome.BEFORE`: the call never reaches the server; the client raises what it raises when
  the connection is lost on the way (psycopg's "server closed the connection", librdkafka's
  retriable time-out, botocore's ConnectionClosedError, EIO);
- `Outcome.LOST`: the call takes effect on the server, then its answer is lost and the client
  raises the same error. This is the case a coordinator must never guess: the effect is
  there although the caller heard a failure.

Each client keeps its own reaction to the error: botocore retries the request (a lost
CompleteMultipartUpload's retry finds no upload; a lost conditional PutObject's retry is
refused as already there), librdkafka resumes a timed-out transactional call when it is
called again (a commit that took effect then returns success), a lost Postgres session
stays lost (the sink opens another). The wrappers act on the real clients; nothing of the
servers is faked.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException

if TYPE_CHECKING:
    from botocore.awsrequest import AWSPreparedRequest
    from mypy_boto3_s3 import S3Client


class Outcome(Enum):
    """How the target call fails (module docstring)."""

    BEFORE = "before"
    LOST = "lost"


@dataclass
class Faults:
    """The plan of one case: which state-changing call fails (`target`, 1-based, None for
    none) and how; `calls` records every call seen, in order, as `client:operation`."""

    target: int | None = None
    outcome: Outcome = Outcome.BEFORE
    calls: list[str] = field(default_factory=list)
    hit: str | None = None
    armed: bool = True

    def next(self, call: str) -> Outcome | None:
        """Count `call`; its outcome if it is the target."""
        if not self.armed:
            return None
        self.calls.append(call)
        if len(self.calls) == self.target:
            self.hit = call
            return self.outcome
        return None

    def describe(self) -> str:
        if self.target is None:
            return "no fault"
        return f"call {self.target} ({self.hit or 'not reached'}) {self.outcome.value}"


def injected(outcome: Outcome, call: str) -> str:
    where = "before it reached the server" if outcome is Outcome.BEFORE else "after it took effect"
    return f"connection lost (injected {where}: {call})"


# -- Postgres --------------------------------------------------------------------------------------
_PG_STATEMENTS = ("PREPARE TRANSACTION", "COMMIT PREPARED", "ROLLBACK PREPARED")


class _FaultyConnection:
    """A real psycopg connection whose two-phase statements and commits go through `faults`;
    a failed one closes the session (as a lost connection does) and raises psycopg's
    OperationalError without SQLSTATE."""

    def __init__(self, real: psycopg.Connection[Any], faults: Faults) -> None:
        self._real = real
        self._faults = faults

    def _lose(self, call: str, outcome: Outcome, effect: Callable[[], Any]) -> None:
        if outcome is Outcome.LOST:
            effect()
        self._real.close()
        raise psycopg.OperationalError(injected(outcome, call))

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else query.as_string(self._real)
        statement = next((s for s in _PG_STATEMENTS if text.startswith(s)), None)
        if statement is not None:
            outcome = self._faults.next(f"postgres:{statement}")
            if outcome is not None:
                self._lose(statement, outcome, lambda: self._real.execute(query, *args, **kwargs))
        return self._real.execute(query, *args, **kwargs)

    def commit(self) -> None:
        outcome = self._faults.next("postgres:COMMIT")
        if outcome is not None:
            self._lose("COMMIT", outcome, self._real.commit)
        self._real.commit()

    def __enter__(self) -> _FaultyConnection:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._real.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def postgres(monkeypatch: pytest.MonkeyPatch, faults: Faults) -> None:
    """Every Postgres sink's sessions go through `faults`."""
    from durable_sinks.sinks.postgres.sink import PostgresSink

    real_connect = PostgresSink._connect

    def connect(self: PostgresSink, *, autocommit: bool) -> Any:
        return _FaultyConnection(real_connect(self, autocommit=autocommit), faults)

    monkeypatch.setattr(PostgresSink, "_connect", connect)


# -- Kafka -----------------------------------------------------------------------------------------
_KAFKA_CALLS = ("init_transactions", "commit_transaction", "abort_transaction")


class _FaultyProducer:
    """A real producer whose transactional calls go through `faults`. A failed call raises
    librdkafka's retriable _TIMED_OUT; after `Outcome.LOST` the call took effect and the next
    call of the same method returns at once, as librdkafka's resumed call does once the
    broker has answered."""

    def __init__(self, real: Any, faults: Faults) -> None:
        self._real = real
        self._faults = faults
        self._resumed: set[str] = set()

    def _call(self, name: str, *args: Any) -> Any:
        if name in self._resumed:
            self._resumed.discard(name)
            return None
        outcome = self._faults.next(f"kafka:{name}")
        if outcome is None:
            return getattr(self._real, name)(*args)
        if outcome is Outcome.LOST:
            getattr(self._real, name)(*args)
            self._resumed.add(name)
        raise KafkaException(
            KafkaError(KafkaError._TIMED_OUT, injected(outcome, name), retriable=True)
        )

    def init_transactions(self, *args: Any) -> Any:
        return self._call("init_transactions", *args)

    def commit_transaction(self, *args: Any) -> Any:
        return self._call("commit_transaction", *args)

    def abort_transaction(self, *args: Any) -> Any:
        return self._call("abort_transaction", *args)

    def __len__(self) -> int:
        return len(self._real)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def kafka(monkeypatch: pytest.MonkeyPatch, faults: Faults) -> None:
    """Every Kafka sink's producers go through `faults`."""
    from confluent_kafka import Producer

    def make(*args: Any, **kwargs: Any) -> Any:
        return _FaultyProducer(Producer(*args, **kwargs), faults)

    monkeypatch.setattr("durable_sinks.sinks.kafka.writer.Producer", make)


# -- Delta and Iceberg -----------------------------------------------------------------------------
def _wrap_commit(
    monkeypatch: pytest.MonkeyPatch,
    owner: Any,
    method: str,
    call: str,
    faults: Faults,
    error: Callable[[str], BaseException],
) -> None:
    real = getattr(owner, method)

    def commit(*args: Any, **kwargs: Any) -> Any:
        outcome = faults.next(call)
        if outcome is None:
            return real(*args, **kwargs)
        if outcome is Outcome.LOST:
            real(*args, **kwargs)
        raise error(injected(outcome, call))

    monkeypatch.setattr(owner, method, commit)


def delta(monkeypatch: pytest.MonkeyPatch, faults: Faults) -> None:
    """delta-rs's commit of a write transaction (a new log version) goes through `faults`;
    a failed one raises the OSError delta-rs raises for a lost connection to its storage."""
    from deltalake import DeltaTable

    _wrap_commit(
        monkeypatch, DeltaTable, "create_write_transaction", "delta:commit", faults, OSError
    )


def iceberg(monkeypatch: pytest.MonkeyPatch, faults: Faults) -> None:
    """pyiceberg's commit of a transaction (the catalog's swap of the table's metadata)
    goes through `faults`; a failed one raises CommitStateUnknownException, pyiceberg's
    answer when the catalog's reply is lost."""
    from pyiceberg.exceptions import CommitStateUnknownException
    from pyiceberg.table import Transaction

    _wrap_commit(
        monkeypatch,
        Transaction,
        "commit_transaction",
        "iceberg:commit",
        faults,
        CommitStateUnknownException,
    )


# -- S3 --------------------------------------------------------------------------------------------
_S3_OPERATIONS = (
    "PutObject",
    "CompleteMultipartUpload",
    "AbortMultipartUpload",
    "DeleteObject",
    "DeleteObjects",
    "CopyObject",
)


@contextlib.contextmanager
def s3(client: S3Client, faults: Faults) -> Iterator[None]:
    """The state-changing requests of `client` (the sinks' and stores' shared client) go
    through `faults`. botocore retries a connection error itself: a request failed before
    the server is sent again, and one whose answer was lost is sent a second time, which
    meets the first one's effect."""
    from botocore.exceptions import ConnectionClosedError

    def maybe_fail(request: AWSPreparedRequest, operation: str, **_: Any) -> None:
        outcome = faults.next(f"s3:{operation}")
        if outcome is None:
            return
        if outcome is Outcome.LOST:
            client._endpoint.http_session.send(request)  # type: ignore[attr-defined]
        raise ConnectionClosedError(endpoint_url=request.url, error=injected(outcome, operation))

    for operation in _S3_OPERATIONS:

        def handler(request: AWSPreparedRequest, _op: str = operation, **kw: Any) -> None:
            maybe_fail(request, _op, **kw)

        event = f"before-send.s3.{operation}"
        client.meta.events.register(event, handler, unique_id=f"simulation-{operation}")
    try:
        yield
    finally:
        for operation in _S3_OPERATIONS:
            client.meta.events.unregister(
                f"before-send.s3.{operation}", unique_id=f"simulation-{operation}"
            )


# -- local folders ---------------------------------------------------------------------------------
def folders(monkeypatch: pytest.MonkeyPatch, roots: list[Path], faults: Faults) -> None:
    """Links, renames, removals and exclusive creations of paths under `roots` (a local
    directory store, a files sink's dataset) go through `faults`; a failed one raises EIO."""
    prefixes = [str(root.resolve()) + os.sep for root in roots]

    def ours(path: Any) -> bool:
        if isinstance(path, int):
            return False
        text = os.path.abspath(os.fsdecode(path))
        return any(text.startswith(p) for p in prefixes)

    def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not args or not ours(args[0]) or Path(os.fsdecode(args[0])).name.startswith(".tmp"):
                return real(*args, **kwargs)
            if name == "open" and not (len(args) > 1 and args[1] & os.O_CREAT):
                return real(*args, **kwargs)
            outcome = faults.next(f"fs:{name}")
            if outcome is None:
                return real(*args, **kwargs)
            if outcome is Outcome.LOST:
                result = real(*args, **kwargs)
                if name == "open":
                    os.close(result)
            raise OSError(errno.EIO, injected(outcome, f"{name} {os.fsdecode(args[0])}"))

        return call

    for name in ("link", "rename", "replace", "unlink", "rmdir", "open"):
        monkeypatch.setattr(os, name, wrap(name, getattr(os, name)))
    from durable_sinks.core.durable_fs import rename_noreplace

    monkeypatch.setattr(
        "durable_sinks.sinks.folder.committer.rename_noreplace",
        wrap("rename_noreplace", rename_noreplace),
    )
