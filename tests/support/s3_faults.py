"""Faults injected into one boto3 S3 client through botocore's event hooks: a server that
ignores conditional writes, a request that fails (before or after the server handled it), and
a count of the requests made.

The S3 sink and the S3 decision store share one cached client per settings
(`durable_sinks.clients.s3.S3Connection(...).client()`), so a test that builds the same
S3Connection gets the very client they use and can break it:

    connection = S3Connection(endpoint_url=s3.endpoint_url, ...)   # the sink's settings
    client = connection.client()                                     # the sink's own client
    with fail_request(client, "CompleteMultipartUpload", ConnectionClosedError, sent=True):
        ...  # the server completes the upload, the sink never hears back

Every hook is removed when its `with` block ends. Hooks act on every thread using the client.

What botocore does with an injected failure is what it does with a real one: connection errors
(ConnectionClosedError, EndpointConnectionError, ReadTimeoutError, ...) and retriable error
responses (`ErrorResponse("SlowDown", 503)`) are retried by the client itself (the sink's and
the test bed's clients make up to 4 attempts: to botocore, `retries={"max_attempts": 3}` means
3 retries), so a single failed attempt reaches the code under test only as a retry;
`times=None` fails every attempt.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from botocore.awsrequest import AWSPreparedRequest, AWSRequest
    from mypy_boto3_s3 import S3Client

__all__ = [
    "ErrorResponse",
    "FailedRequests",
    "RequestCounts",
    "count_requests",
    "fail_request",
    "without_conditional_writes",
]

CONDITIONAL_HEADERS = ("If-None-Match", "If-Match")


@contextlib.contextmanager
def _hook(client: S3Client, event: str, handler: Callable[..., Any]) -> Iterator[None]:
    unique_id = f"tests.support.s3_faults.{uuid.uuid4().hex}"
    client.meta.events.register(event, handler, unique_id=unique_id)
    try:
        yield
    finally:
        client.meta.events.unregister(event, unique_id=unique_id)


@contextlib.contextmanager
def without_conditional_writes(client: S3Client) -> Iterator[list[str]]:
    """Strip If-None-Match and If-Match from every request of `client` before it is signed:
    a server that ignores conditional writes, as some S3-compatible servers do (the write
    goes through and overwrites). Yields the operations whose conditions were dropped."""
    dropped: list[str] = []

    def strip(request: AWSRequest, operation_name: str = "", **_: Any) -> None:
        found = [h for h in CONDITIONAL_HEADERS if h in request.headers]
        for header in found:
            del request.headers[header]
        if found:
            dropped.append(operation_name)

    with _hook(client, "before-sign.s3.*", strip):
        yield dropped


@dataclass(frozen=True)
class ErrorResponse:
    """An error answer from the server, e.g. `ErrorResponse("SlowDown", 503)` or
    `ErrorResponse("InternalError", 500)`: botocore parses and retries it like a real one."""

    code: str
    status: int
    message: str = "injected by tests.support.s3_faults"

    def body(self) -> bytes:
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{self.code}</Code><Message>{self.message}</Message>"
            "<RequestId>s3-faults</RequestId></Error>"
        ).encode()


class _Body:
    """The `raw` of a botocore AWSResponse: something with stream()."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._data


#: An exception class (botocore's connection errors take `endpoint_url`), an exception, or an
#: error answer from the server.
Failure = type[BaseException] | BaseException | ErrorResponse


@dataclass
class FailedRequests:
    """What `fail_request` did: `attempts` of the operation seen, `failed` of them broken."""

    operation: str
    attempts: int = 0
    failed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


@contextlib.contextmanager
def fail_request(
    client: S3Client,
    operation: str,
    error: Failure,
    *,
    nth: int = 1,
    times: int | None = 1,
    sent: bool = False,
) -> Iterator[FailedRequests]:
    """Fail attempts `nth`, `nth + 1`, ... (`times` of them; None: every one from `nth` on) of
    `operation` ("CompleteMultipartUpload", "PutObject", ...) made by `client`, counting
    HTTP attempts (botocore's own retries included) from the start of the block.

    `sent=False`: the request never reaches the server. `sent=True`: it is sent and the server
    handles it, then its answer is lost and `error` raised instead: the ambiguous outcome a
    commit must survive (e.g. an upload completed although the caller saw a dropped
    connection). An `ErrorResponse` is answered in place of the server's (after it handled the
    request when `sent=True`)."""
    from botocore.awsrequest import AWSResponse
    from botocore.compat import HTTPHeaders
    from botocore.exceptions import BotoCoreError

    if nth < 1 or (times is not None and times < 1):
        raise ValueError("nth and times count from 1")
    state = FailedRequests(operation)

    def maybe_fail(request: AWSPreparedRequest, **_: Any) -> AWSResponse | None:
        with state._lock:
            state.attempts += 1
            attempt = state.attempts
            if attempt < nth or (times is not None and attempt >= nth + times):
                return None
            state.failed += 1
        if sent:
            # The endpoint's own HTTP session, as botocore would send it (private attribute:
            # botocore offers no public way to send a prepared request through a client).
            client._endpoint.http_session.send(request)  # type: ignore[attr-defined]
        if isinstance(error, ErrorResponse):
            return AWSResponse(
                request.url,
                error.status,
                HTTPHeaders.from_dict(
                    {"Content-Type": "application/xml", "x-amz-request-id": "s3-faults"}
                ),
                _Body(error.body()),
            )
        if isinstance(error, BaseException):
            raise error
        if issubclass(error, BotoCoreError):
            raise error(endpoint_url=request.url, error="injected by tests.support.s3_faults")
        raise error()

    with _hook(client, f"before-send.s3.{operation}", maybe_fail):
        yield state


@dataclass
class RequestCounts:
    """Requests made by a client, by operation name: `calls` counts API calls (what the code
    asked for), `sent` counts HTTP attempts (botocore's retries included)."""

    calls: Counter[str] = field(default_factory=Counter)
    sent: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def total(self) -> int:
        return sum(self.calls.values())


@contextlib.contextmanager
def count_requests(client: S3Client) -> Iterator[RequestCounts]:
    """Count the operations `client` performs inside the block, e.g.
    `counts.calls["PutObject"] == 1` and `counts.calls["AbortMultipartUpload"] == 0`."""
    counts = RequestCounts()

    def called(model: Any, **_: Any) -> None:
        with counts._lock:
            counts.calls[model.name] += 1

    def sent(event_name: str, **_: Any) -> None:
        with counts._lock:
            counts.sent[event_name.rpartition(".")[2]] += 1

    with _hook(client, "before-call.s3.*", called), _hook(client, "before-send.s3.*", sent):
        yield counts
