"""Bounded waits: a Postgres connection that carries nothing (the faults bed's Toxiproxy drops
every byte both ways and closes nothing, which no TCP setting notices, since the proxy still
acknowledges TCP) is taken for lost after the sink's statement_timeout_s + 10 s, in each
protocol call of the sink; the epoch fails typed within that bound, and once the connection
carries data again a new coordinator finishes the job exactly once."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from durable_sinks.clients.postgres import ANSWER_GRACE_S
from durable_sinks.coordinator import Coordinator, EpochOutcome, RetryPolicy
from durable_sinks.core.errors import DurableSinkError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.support.fault_bed import FaultBed

STATEMENT_TIMEOUT_S = 1.0
BOUND_S = STATEMENT_TIMEOUT_S + ANSWER_GRACE_S
#: New connections to the silent server (the fence check after a lost session, the rollback's)
#: each fail after this.
CONNECT_TIMEOUT_S = 2
#: No retry in place: each call fails once, at the bound.
ONCE = RetryPolicy(attempts=1)


def coordinator(
    bed: FaultBed, schema: str, tmp_path: Path, on_step: Callable[[str], None]
) -> Coordinator:
    postgres = PostgresSink(
        Postgres(
            bed.postgres_proxied.conninfo(),
            f"{schema}.events",
            create_table=True,
            statement_timeout_s=STATEMENT_TIMEOUT_S,
            connect_timeout_s=CONNECT_TIMEOUT_S,
        )
    )
    files = FolderSink(Files(str(tmp_path / "files"), name="files"))
    made = Coordinator(
        "bounded",
        [postgres, files],
        LocalDirectoryStore(tmp_path / "store"),
        source="q",
        commit_retry=ONCE,
        on_step=on_step,
    )
    made.start()
    return made


ROWS = pa.record_batch({"id": pa.array(range(50), pa.int64())})


@pytest.mark.parametrize(
    ("step", "call"),
    [
        pytest.param("after-begin:files", "write_batch", marks=pytest.mark.fault_tier),
        ("after-write:0:files", "pre_commit"),  # PREPARE TRANSACTION: its outcome unknown
        pytest.param("after-decision", "commit_epoch", marks=pytest.mark.fault_tier),
    ],
)
def test_a_silent_connection_is_lost_within_the_bound_and_the_epoch_lands_once(
    fault_bed: FaultBed, fault_pg_schema: str, tmp_path: Path, step: str, call: str
) -> None:
    proxy = fault_bed.postgres_proxy
    holes: list[Any] = []

    def at(name: str) -> None:
        if name == step and not holes:
            hole = proxy.black_hole()
            hole.__enter__()
            holes.append(hole)

    first = coordinator(fault_bed, fault_pg_schema, tmp_path, at)
    started = time.monotonic()
    try:
        with pytest.raises(DurableSinkError) as raised:
            first.run_epoch(0, [ROWS])  # its call on the silent connection fails at the bound
        failed_after = time.monotonic() - started
    finally:
        for hole in holes:
            hole.__exit__(None, None, None)
        first.close()
    assert holes, f"the job never reached {step}"
    assert "no answer from the server" in str(raised.value), raised.value
    # The call fails at the bound; the attempt's rollback then meets the silence on the sink's
    # other session (at the bound again) and on new sessions (at connect_timeout_s each).
    assert BOUND_S - 1 <= failed_after <= 2 * BOUND_S + 2 * CONNECT_TIMEOUT_S + 5, failed_after
    assert raised.value.sink == "postgres", raised.value

    again = coordinator(fault_bed, fault_pg_schema, tmp_path, lambda _name: None)
    try:
        result = again.run_epoch(0, [ROWS])
        assert result.outcome in (EpochOutcome.COMMITTED, EpochOutcome.ALREADY_COMMITTED)
    finally:
        again.close()
    with psycopg.connect(fault_bed.postgres_direct.conninfo(), autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(f'SELECT id FROM "{fault_pg_schema}".events ORDER BY id')]
        assert ids == list(range(50))
        assert conn.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE 'ds:bounded:%'"
        ).fetchone() == (0,)
