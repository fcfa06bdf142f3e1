"""The replay check in a real Spark query: a batch whose epoch committed is replayed (its
commit-log entry removed, as when the driver dies after the batch landed but before Spark
logged it) after its source file was rewritten: a non-deterministic source."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from durable_sinks import ReplayMismatchError
from durable_sinks.coordinator import EpochOutcome
from durable_sinks.spark import durable_sink
from tests.services import PostgresEndpoint

from .streams import (
    postgres_ids,
    prepared_transactions,
    run_available_now,
    source_stream,
    write_input,
)


def postgres_rows(dsn: str, table: str) -> list[tuple[int, str]]:
    schema, name = table.split(".")
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT id, body FROM {} ORDER BY id").format(sql.Identifier(schema, name))
        return [(int(i), str(b)) for i, b in conn.execute(query).fetchall()]


def replay_batch(checkpoint: Path, batch: int) -> Path:
    """Remove batch `batch`'s commit-log entry, so that a restarted query runs it again;
    the source file it read (from the file source's log)."""
    for name in (str(batch), f".{batch}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    lines = (checkpoint / "sources" / "0" / str(batch)).read_text().splitlines()
    (entry,) = [json.loads(line) for line in lines[1:]]  # (the first line: the log version)
    return Path(entry["path"].removeprefix("file:"))


def rewrite(path: Path, body: str) -> None:
    """The source file at `path`, rewritten with the same ids but another body (renamed into
    place)."""
    ids = [json.loads(line)["id"] for line in path.read_text().splitlines()]
    staging = path.parent.parent / f".{path.name}.rewritten"
    staging.write_text("".join(json.dumps({"id": i, "body": f"{body} {i}"}) + "\n" for i in ids))
    staging.rename(path)


def test_a_replayed_batch_with_changed_source_data_is_warned_about_or_fails_the_query(
    spark: Any,
    postgres: PostgresEndpoint,
    pg_schema: str,
    job_id: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, checkpoint, table = tmp_path / "in", tmp_path / "checkpoint", f"{pg_schema}.events"
    dsn = postgres.conninfo()
    write_input(source, "part-0.json", range(0, 10))
    write_input(source, "part-1.json", range(10, 20))
    writer = durable_sink("postgres", dsn=dsn, table=table, job_id=job_id, create_table=True)
    run_available_now(source_stream(spark, source), writer, checkpoint)
    committed = postgres_rows(dsn, table)
    assert [i for i, _ in committed] == list(range(20))
    assert writer.last_result is not None
    assert writer.last_result.epoch == 1
    assert writer.last_result.decision.content is not None  # (carried in the marker row)
    caplog.set_level(logging.INFO, logger="durable_sinks")

    def warnings() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if "with other rows than it committed" in r.getMessage()
        ]

    # 1. Replayed with the same data: it passes, nothing is written again.
    file = replay_batch(checkpoint, 1)
    same = durable_sink("postgres", dsn=dsn, table=table, job_id=job_id)
    run_available_now(source_stream(spark, source), same, checkpoint)
    assert same.last_result is not None
    assert (same.last_result.epoch, same.last_result.outcome) == (1, EpochOutcome.ALREADY_COMMITTED)
    assert same._coordinator is not None
    assert same._coordinator.totals.replay_mismatches == 0
    assert warnings() == []
    assert "the replay gave the rows the epoch committed" in caplog.text

    # 2. The batch's file was rewritten meanwhile: other rows. Warned and counted (default);
    # the committed rows stay.
    file = replay_batch(checkpoint, 1)
    rewrite(file, "changed")
    warned = durable_sink("postgres", dsn=dsn, table=table, job_id=job_id)
    run_available_now(source_stream(spark, source), warned, checkpoint)
    assert warned.last_result is not None
    assert warned.last_result.outcome is EpochOutcome.ALREADY_COMMITTED
    assert warned._coordinator is not None
    assert warned._coordinator.totals.replay_mismatches == 1
    (warning,) = warnings()
    assert f"job={job_id}" in warning
    assert "epoch=1" in warning
    assert "committed 10 rows, digest" in warning
    assert "replayed 10 rows, digest" in warning
    assert "not deterministic" in warning
    assert postgres_rows(dsn, table) == committed

    # 3. replay_check="fail": the query stops with ReplayMismatchError once the epoch is
    # finished; the committed rows stay exactly once, Spark does not log the batch as done.
    replay_batch(checkpoint, 1)
    strict = durable_sink("postgres", dsn=dsn, table=table, job_id=job_id, replay_check="fail")
    with pytest.raises(Exception, match="ReplayMismatchError") as raised:
        run_available_now(source_stream(spark, source), strict, checkpoint)
    assert not isinstance(raised.value, AssertionError)
    assert isinstance(strict.last_error, ReplayMismatchError)
    assert strict.last_error.epoch == 1
    assert not (checkpoint / "commits" / "1").exists()
    assert postgres_rows(dsn, table) == committed
    assert postgres_ids(dsn, table) == list(range(20))
    assert prepared_transactions(dsn, job_id) == []
