"""Real Spark jobs on the faults bed ride through server restarts, killed sessions and broker
kills at protocol steps without the query stopping, exactly once in every sink; an outage
longer than the bound fails the query with OutageError, and a restart finishes exactly once.

The default suite runs one instance of each fault; `make test-faults` (DS_FAULT_MATRIX=1) runs
each fault at every protocol step of a batch and during recovery (docs/reliability.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durable_sinks.core.errors import OutageError
from durable_sinks.spark import sink
from tests.spark.streams import postgres_ids
from tests.support.fault_bed import FaultBed

from .jobs import (
    HIT_EPOCH,
    RECOVERY_STEPS,
    ROWS_PER_BATCH,
    STEPS_PG_KAFKA,
    Fault,
    Job,
    Trigger,
    check_ridden_through,
    kafka_restart,
    postgres_restart,
    postgres_terminate,
    toxic,
)

MATRIX = os.environ.get("DS_FAULT_MATRIX") == "1"
#: How long the Postgres restarts keep the server down (the issue's bar: 30 s).
PG_DOWN_S = 30.0
KAFKA_DOWN_S = 5.0
PRELUDE_DOWN_S = 8.0
#: Longer than the transaction time-out (3 s) plus the faults broker's check for timed-out
#: transactions (transaction.abort.timed.out.transaction.cleanup.interval.ms: 1 s there).
STALL_S = 7.0

FAULTS: dict[str, Callable[[FaultBed], Fault]] = {
    "pg-immediate": lambda bed: postgres_restart(bed, "immediate", PG_DOWN_S),
    "pg-fast": lambda bed: postgres_restart(bed, "fast", PG_DOWN_S),
    "pg-terminate": postgres_terminate,
    "kafka-kill": lambda bed: kafka_restart(bed, KAFKA_DOWN_S),
    # through Toxiproxy (the job reaches Postgres, its decision store and Kafka through it)
    "pg-reset": lambda bed: toxic(
        bed.postgres_proxy, "Postgres connections reset", 3, method="reset_peer"
    ),
    "pg-blackhole": lambda bed: toxic(
        bed.postgres_proxy, "Postgres black-holed", 5, method="black_hole"
    ),
    "pg-latency": lambda bed: toxic(
        bed.postgres_proxy, "Postgres 300 ms latency", 5, method="latency", latency_ms=300
    ),
    "pg-slow-close": lambda bed: toxic(
        bed.postgres_proxy,
        "Postgres closes delayed 2 s",
        5,
        method="slow_close",
        delay_ms=2000,
    ),
    "kafka-reset": lambda bed: toxic(
        bed.kafka_proxy, "Kafka connections reset", 3, method="reset_peer"
    ),
    "kafka-blackhole": lambda bed: toxic(
        bed.kafka_proxy, "Kafka black-holed", 5, method="black_hole"
    ),
}
#: One instance of each fault in the default suite: the hardest step for each.
DEFAULT = [
    ("pg-immediate", "after-decision"),  # decided (Kafka committed), Postgres still prepared
    ("pg-terminate", "after-write:0:postgres"),  # mid-transaction
    ("kafka-kill", "after-write:0:kafka"),  # the Kafka transaction open
    ("pg-reset", "after-pre-commit:postgres"),  # prepared, the decision store's put next
    ("kafka-blackhole", "after-pre-commit:kafka"),  # the commit point next
]
CASES = (
    [(fault, step) for fault in FAULTS for step in (*STEPS_PG_KAFKA, *RECOVERY_STEPS)]
    if MATRIX
    else DEFAULT
)


@pytest.fixture
def job(
    fault_bed: FaultBed,
    spark: Any,
    fault_pg_schema: str,
    fault_kafka_topic: str,
    job_id: str,
    tmp_path: Path,
) -> Job:
    made = Job(fault_bed, spark, fault_pg_schema, fault_kafka_topic, job_id, tmp_path)
    made.write_input()
    return made


@pytest.mark.parametrize(("fault", "step"), CASES)
def test_a_fault_at_a_step_is_ridden_through_exactly_once(
    job: Job, fault_bed: FaultBed, fault: str, step: str
) -> None:
    triggers = [Trigger(HIT_EPOCH, step, FAULTS[fault](fault_bed))]
    if step.startswith("recovery:"):
        # Recovery runs when a new coordinator starts: in a ride-out, after a failed attempt.
        # Postgres down for longer than commit_retry (~6.4 s) right after the decision makes
        # the first one fail, leaving a decided participant for recovery to commit.
        down = postgres_restart(fault_bed, "immediate", PRELUDE_DOWN_S)
        first = Trigger(HIT_EPOCH, "after-decision", down)
        triggers.insert(0, first)
    writer = job.writer(triggers)
    job.run(writer)  # raises if the query stopped
    check_ridden_through(writer, triggers[-1:])
    job.check_exactly_once()


def test_an_outage_longer_than_the_bound_fails_typed_and_a_restart_finishes_exactly_once(
    job: Job, fault_bed: FaultBed
) -> None:
    job.options = {"outage_tolerance_s": 4.0}
    stopped = Fault("postgres stopped", lambda: fault_bed.postgres_server.stop("immediate"))
    writer = job.writer([Trigger(HIT_EPOCH, "after-pre-commit:kafka", stopped)])
    with pytest.raises(Exception, match="OutageError") as caught:
        job.run(writer)
    error = writer.last_error
    assert isinstance(error, OutageError), error
    assert "outage_tolerance_s=4" in str(error)
    assert "restart the query from its checkpoint" in str(error)
    assert f"port={fault_bed.postgres_proxied.port}" in str(error)  # the server is named
    assert "psycopg" not in str(caught.value).split("OutageError", 1)[0]

    fault_bed.postgres_server.start()
    restarted = job.writer()
    job.run(restarted)
    assert restarted.recovery is not None
    job.check_exactly_once()


def test_a_kafka_transaction_the_broker_timed_out_is_written_again_exactly_once(
    job: Job, fault_bed: FaultBed
) -> None:
    """The batch stalls between writing and preparing for longer than the producer's
    transaction.timeout.ms: the broker aborts the transaction (nothing of it is visible) and
    the batch is written again, once."""
    job.kafka_options = {"transaction_timeout_s": 3.0}
    stall = Fault("a batch stalled past transaction.timeout.ms", lambda: time.sleep(STALL_S))
    writer = job.writer([Trigger(HIT_EPOCH, "after-write:0:kafka", stall)])
    job.run(writer)
    assert writer.failed_attempts >= 1
    job.check_exactly_once()


def test_the_decision_store_unreachable_at_the_decision_commits_nothing_then_fails_typed(
    fault_bed: FaultBed, spark: Any, fault_pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    """Postgres + files with the decision store reached through the proxy, cut just before
    the decision: nothing of the batch becomes visible, the batch is retried until the bound,
    then OutageError; once the store is back a restart lands every batch once."""
    out = tmp_path / "out"
    job = Job(fault_bed, spark, fault_pg_schema, None, job_id, tmp_path)
    job.extra_sinks = [sink("files", path=str(out))]
    job.options = {
        "decision_store": fault_bed.postgres_proxied.conninfo(),
        "outage_tolerance_s": 4.0,
    }
    job.write_input()

    cut = Fault("decision store cut off", fault_bed.postgres_proxy.disable)
    first = job.writer([Trigger(HIT_EPOCH, "after-pre-commit:files", cut)])
    with pytest.raises(Exception, match="OutageError"):
        job.run(first)
    assert isinstance(first.last_error, OutageError)
    assert "the job's decision store" in str(first.last_error)
    # only the first batch is visible (which rows it holds is the file source's choice)
    assert len(postgres_ids(fault_bed.postgres_direct.conninfo(), job.table)) == ROWS_PER_BATCH
    assert published_epochs(out) == [0]

    fault_bed.postgres_proxy.enable()
    left = job.prepared()
    assert len(left) == 1  # the batch's Postgres part, prepared, its decision in doubt
    restarted = job.writer()
    # The restart's recovery says what it found and did: both parts of the undecided batch
    # (Postgres' prepared transaction, the files sink's staged folder) rolled back.
    report = job.recoveries[-1]
    assert report is not None
    assert sorted(h.sink for h in report.rolled_back) == ["files", "postgres"]
    assert [h.participant for h in report.rolled_back if h.sink == "postgres"] == left
    assert report.committed == []
    assert "2 leftover participants found; committed 0, rolled back 2" in str(report)
    assert job.prepared() == []
    job.run(restarted)
    job.check_exactly_once()  # Postgres, and nothing left prepared
    assert published_epochs(out) == list(range(job.batches))


def published_epochs(out: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("epoch=")) for p in out.glob("epoch=*"))


def test_executor_mode_rides_out_a_postgres_restart_its_tasks_met(
    fault_bed: FaultBed, spark: Any, fault_pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    """Executor mode: Postgres is down when the batch's tasks connect; each task rolls its
    part back and hands its typed error to the driver, which rides the outage out."""
    job = Job(fault_bed, spark, fault_pg_schema, None, job_id, tmp_path)
    job.options = {"execution": "executor"}
    job.write_input()
    down = postgres_restart(fault_bed, "immediate", 8.0)
    writer = job.writer([Trigger(HIT_EPOCH, "epoch-start", down)])
    job.run(writer)
    check_ridden_through(writer, writer.triggers)
    job.check_exactly_once()
