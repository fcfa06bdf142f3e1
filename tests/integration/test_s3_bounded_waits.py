"""Bounded waits on S3: a connection that carries nothing (Toxiproxy in front of the test bed's
S3 server drops every byte both ways and closes nothing, so TCP still answers) fails each
request after `request_attempts` x `request_timeout_s` (plus botocore's back-off), in each
protocol call of the S3 sink; the epoch fails typed within the bound its calls add up to, and
once the connection carries data again a new coordinator lands the epoch exactly once and
leaves no upload open."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from durable_sinks.clients.s3 import S3Connection, S3Location
from durable_sinks.coordinator import Coordinator, EpochOutcome, RetryPolicy
from durable_sinks.core.errors import CommitIncompleteError, DurableSinkError, TransientError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.manifest.s3 import S3DecisionStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.sinks.s3 import S3Sink, committed_dataset
from tests.integration.test_s3_sink import leftovers, reader_settings
from tests.services import S3Endpoint
from tests.support.fault_bed import FaultBed
from tests.support.s3_target import s3_sink_config

REQUEST_TIMEOUT_S = 1.0
REQUEST_ATTEMPTS = 2
CONNECT_TIMEOUT_S = 1.0
#: No retry in place: each call fails once.
ONCE = RetryPolicy(attempts=1)
MiB = 1024 * 1024


def s3_sink(endpoint: S3Endpoint, path: str, **options: Any) -> S3Sink:
    return S3Sink(
        s3_sink_config(
            endpoint,
            path,
            request_timeout_s=REQUEST_TIMEOUT_S,
            request_attempts=REQUEST_ATTEMPTS,
            connect_timeout_s=CONNECT_TIMEOUT_S,
            **options,
        )
    )


def coordinator(
    endpoint: S3Endpoint,
    path: str,
    tmp_path: Path,
    on_step: Callable[[str], None],
    *,
    s3_first: bool,
    options: dict[str, Any] | None = None,
) -> Coordinator:
    s3 = s3_sink(endpoint, path, **(options or {}))
    files = FolderSink(Files(str(tmp_path / "files"), name="files"))
    made = Coordinator(
        "bounded",
        [s3, files] if s3_first else [files, s3],
        LocalDirectoryStore(tmp_path / "store"),
        source="q",
        commit_retry=ONCE,
        on_step=on_step,
    )
    made.start()
    return made


ROWS = pa.record_batch({"id": pa.array(range(50), pa.int64())})


#: Six rows of 1 MiB each (random, so incompressible): the first part (5 MiB) is sent while
#: the batch is written, the upload created for it first.
LARGE = pa.record_batch(
    {
        "id": pa.array(range(6), pa.int64()),
        "blob": pa.array([os.urandom(MiB) for _ in range(6)], pa.binary()),
    }
)
#: Large batches are encoded at once (a 1 MiB row group) into 5 MiB parts.
LARGE_OPTIONS = {"row_group_bytes": MiB, "part_size_bytes": 5 * MiB}


@pytest.mark.parametrize(
    ("step", "s3_first", "call", "expected", "large"),
    [
        # The hole opens before the S3 sink begins (which sends nothing): writing the large
        # batch creates the upload and sends its first part.
        pytest.param(
            "after-begin:files",
            False,
            "write_batch",
            TransientError,
            True,
            marks=pytest.mark.fault_tier,
        ),
        # ... after small batches are written (gathered in memory): pre_commit creates the
        # upload and sends the only part.
        ("after-write:0:files", True, "pre_commit", TransientError, False),
        # ... after the decision: the upload's completion (then the epoch marker's create).
        # Decided, so the epoch is not rolled back: the commit is finished by the next start.
        pytest.param(
            "after-decision",
            True,
            "commit_epoch",
            CommitIncompleteError,
            False,
            marks=pytest.mark.fault_tier,
        ),
    ],
)
def test_a_silent_connection_fails_within_the_bound_and_the_epoch_lands_once(
    fault_bed: FaultBed,
    s3: S3Endpoint,
    s3_prefix: str,
    tmp_path: Path,
    step: str,
    s3_first: bool,
    call: str,
    expected: type[DurableSinkError],
    large: bool,
) -> None:
    rows, options = (LARGE, LARGE_OPTIONS) if large else (ROWS, {})
    proxied = fault_bed.s3_proxied
    path = f"s3://{s3.bucket}/{s3_prefix.rstrip('/')}"
    bound_s = s3_sink(proxied, path).config.connection.wait_bound_s
    proxy = fault_bed.s3_proxy
    holes: list[Any] = []
    opened_at: list[float] = []

    seen: list[str] = []

    def at(name: str) -> None:
        seen.append(name)
        if name == step and not holes:
            hole = proxy.black_hole()
            hole.__enter__()
            holes.append(hole)
            opened_at.append(time.monotonic())

    first = coordinator(proxied, path, tmp_path, at, s3_first=s3_first, options=options)
    try:
        with pytest.raises(expected) as raised:
            first.run_epoch(0, [rows])
        failed_after = time.monotonic() - opened_at[0] if opened_at else -1.0
    finally:
        for hole in holes:
            hole.__exit__(None, None, None)
        first.close()
    assert holes, f"the job never reached {step}"
    # The call named failed: the S3 sink got through the ones before it, not through it.
    s3_steps = [
        name
        for name in seen
        if name.endswith(":s3") and name.startswith(("after-write:", "after-pre-commit:"))
    ]
    done_before = {
        "write_batch": [],
        "pre_commit": ["after-write:0:s3"],
        "commit_epoch": ["after-write:0:s3", "after-pre-commit:s3"],
    }[call]
    assert s3_steps == done_before, seen
    assert "dropped the request (ReadTimeoutError)" in str(raised.value), raised.value
    assert raised.value.sink == "s3", raised.value
    # The failing request waits each attempt's request_timeout_s; the attempt's rollback then
    # meets the silence once more (aborting the upload), each at most the bound.
    assert REQUEST_ATTEMPTS * REQUEST_TIMEOUT_S - 0.5 <= failed_after <= 2 * bound_s + 2, (
        failed_after,
        bound_s,
    )
    print(f"{call}: failed {failed_after:.1f} s after the hole opened (bound {bound_s:.0f} s)")

    again = coordinator(
        proxied, path, tmp_path, lambda _name: None, s3_first=s3_first, options=options
    )
    try:
        result = again.run_epoch(0, [rows])
        assert result.outcome in (EpochOutcome.COMMITTED, EpochOutcome.ALREADY_COMMITTED)
    finally:
        again.close()
    table = committed_dataset(path, **reader_settings(s3)).to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(rows.num_rows))
    assert leftovers(s3, path) == []


@pytest.mark.fault_tier
def test_a_silent_decision_store_fails_the_decision_within_the_bound_and_the_epoch_lands_once(
    fault_bed: FaultBed, s3: S3Endpoint, s3_prefix: str, tmp_path: Path
) -> None:
    proxied = fault_bed.s3_proxied
    connection = S3Connection(
        endpoint_url=proxied.endpoint_url,
        region=proxied.region,
        access_key_id=proxied.access_key_id,
        secret_access_key=proxied.secret_access_key,
        addressing_style="path",
        request_timeout_s=REQUEST_TIMEOUT_S,
        request_attempts=REQUEST_ATTEMPTS,
        connect_timeout_s=CONNECT_TIMEOUT_S,
    )
    location = S3Location(s3.bucket, f"{s3_prefix.rstrip('/')}/_decisions")
    holes: list[Any] = []
    opened_at: list[float] = []

    def at(name: str) -> None:
        if name == "after-pre-commit:files" and not holes:
            hole = fault_bed.s3_proxy.black_hole()
            hole.__enter__()
            holes.append(hole)
            opened_at.append(time.monotonic())

    def made(on_step: Callable[[str], None]) -> Coordinator:
        files = FolderSink(Files(str(tmp_path / "files"), name="files"))
        other = FolderSink(Files(str(tmp_path / "more"), name="more"))
        coordinator = Coordinator(
            "bounded",
            [other, files],
            S3DecisionStore(location, connection),
            source="q",
            commit_retry=ONCE,
            on_step=on_step,
        )
        coordinator.start()
        return coordinator

    first = made(at)
    try:
        with pytest.raises(DurableSinkError) as raised:
            first.run_epoch(0, [ROWS])
        failed_after = time.monotonic() - opened_at[0] if opened_at else -1.0
    finally:
        for hole in holes:
            hole.__exit__(None, None, None)
        first.close()
    assert holes, "the job never reached its decision"
    print(f"decision: failed {failed_after:.1f} s after the hole opened")
    assert isinstance(raised.value, TransientError), raised.value
    assert "dropped the request (ReadTimeoutError)" in str(raised.value), raised.value
    assert failed_after >= REQUEST_ATTEMPTS * REQUEST_TIMEOUT_S - 0.5
    assert failed_after <= 2 * connection.wait_bound_s + 2, failed_after

    again = made(lambda _name: None)
    try:
        # Nothing was decided: the epoch was rolled back, and runs again in full.
        assert again.run_epoch(0, [ROWS]).outcome is EpochOutcome.COMMITTED
        assert [sink.last_committed_epoch() for sink in again.sinks] == [0, 0]
    finally:
        again.close()
