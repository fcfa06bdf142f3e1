"""Real Spark jobs (Postgres + Kafka) whose Postgres fails over to its standby at a protocol
step of a batch. The job is given the pair's multi-host conninfo
(`target_session_attrs=read-write`) and reconnects to the promoted standby by itself.

- A synchronous standby holds everything the primary acknowledged, prepared transactions
  included: the query rides the failover through at every step, exactly once in Postgres and
  Kafka (read_committed), nothing left prepared; also when the job's decision store is on the
  pair. The pause (fault fired -> batch done) is printed.
- An asynchronous standby that lags (its WAL stream held back from the batch's start) loses
  what the old primary acknowledged: the batch's prepared transaction, or its committed rows
  and marker row. Never silently: the query fails with a typed error naming the sink and the
  epoch, live or at the next start; the documented repair (the lost epochs copied from the
  old primary, started alone) then lands every row once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from durable_sinks.core.errors import CommittedEpochLostError, ParticipantLostError
from durable_sinks.spark import sink
from tests.services import KafkaEndpoint, PostgresEndpoint, PostgresPair
from tests.spark.streams import postgres_ids
from tests.support.operator_cli import repair_epochs, write_job_file

from .jobs import (
    HIT_EPOCH,
    ROWS_PER_BATCH,
    Endpoints,
    Fault,
    FaultyWriter,
    Job,
    Trigger,
    check_ridden_through,
)

pytestmark = pytest.mark.replicated_tier

#: Where the job's Postgres fails over (Kafka's commit is the decision: after-decision is
#: decided with Postgres still prepared).
SYNC_STEPS = (
    "epoch-start",
    "after-write:0:postgres",
    "after-pre-commit:postgres",
    "after-pre-commit:kafka",
    "after-decision",
    "after-commit:postgres",
)
#: A job whose decision store is the pair (Postgres + files: no last resource).
STORE_STEPS = ("after-pre-commit:postgres", "after-pre-commit:files", "after-decision")


def failover(pair: PostgresPair, took: list[float]) -> Fault:
    """Kill the primary and promote the standby; the seconds until it took writes go to
    `took`."""

    def inject() -> None:
        took.append(pair.fail_over())

    # Sessions lost after PREPARE are absorbed by commit_retry (the sink reconnects).
    return Fault(f"failover to the {pair.state().mode} standby", inject, fails_attempt=False)


def make_job(
    pair: PostgresPair,
    mode: str,
    kafka: KafkaEndpoint,
    spark: Any,
    topic: str | None,
    job_id: str,
    folder: Path,
) -> Job:
    """A fresh pair in `mode`, a schema of the job's own on it, the job's input written."""
    pair.reset(mode)  # type: ignore[arg-type]
    bed = Endpoints(pair.endpoint(), kafka)
    with psycopg.connect(bed.postgres_direct.conninfo(), autocommit=True) as conn:
        conn.execute("CREATE SCHEMA failover")
    job = Job(bed, spark, "failover", topic, job_id, folder)
    job.write_input()
    return job


def report_pause(writer: FaultyWriter, trigger: Trigger, took: list[float]) -> float:
    assert trigger.fired_at is not None, f"the failover never reached {trigger.step}"
    pause = writer.done_at[trigger.epoch] - trigger.fired_at
    print(
        f"\nfailover at {trigger.step}: new primary took writes after {took[0]:.2f} s, "
        f"batch {trigger.epoch} done {pause:.2f} s after the kill "
        f"({writer.failed_attempts} failed attempts)"
    )
    return pause


def ride_through_failover(job: Job, pair: PostgresPair, step: str) -> None:
    """Run `job` with the pair failing over at `step` of batch HIT_EPOCH: the query rides it
    through and lands every row exactly once; the pause is printed."""
    took: list[float] = []
    triggers = [Trigger(HIT_EPOCH, step, failover(pair, took))]
    writer = job.writer(triggers)
    job.run(writer)  # raises if the query stopped
    check_ridden_through(writer, triggers)
    report_pause(writer, triggers[0], took)
    job.check_exactly_once()


@pytest.mark.parametrize("step", SYNC_STEPS)
def test_a_failover_to_a_synchronous_standby_is_ridden_through_exactly_once(
    postgres_standby: PostgresPair,
    kafka: KafkaEndpoint,
    kafka_topic: str,
    spark: Any,
    job_id: str,
    tmp_path: Path,
    step: str,
) -> None:
    job = make_job(postgres_standby, "sync", kafka, spark, kafka_topic, job_id, tmp_path)
    ride_through_failover(job, postgres_standby, step)


@pytest.mark.parametrize("step", STORE_STEPS)
def test_a_failover_under_a_decision_store_on_the_pair_is_ridden_through_exactly_once(
    postgres_standby: PostgresPair,
    kafka: KafkaEndpoint,
    spark: Any,
    job_id: str,
    tmp_path: Path,
    step: str,
) -> None:
    job = make_job(postgres_standby, "sync", kafka, spark, None, job_id, tmp_path)
    out = tmp_path / "out"
    job.extra_sinks = [sink("files", path=str(out))]
    job.options = {"decision_store": job.bed.job_postgres.conninfo()}
    ride_through_failover(job, postgres_standby, step)
    published = sorted(int(p.name.removeprefix("epoch=")) for p in out.glob("epoch=*"))
    assert published == list(range(job.batches))


#: Where the job's Postgres fails over to an asynchronous standby that has missed the batch
#: from its start: after the PREPARE (the batch not decided), after the decision (Kafka's
#: commit; Postgres still prepared), after the COMMIT PREPARED (the batch committed).
ASYNC_STEPS = ("after-pre-commit:postgres", "after-decision", "after-commit:postgres")


@pytest.mark.parametrize("step", ASYNC_STEPS)
def test_a_failover_to_a_lagging_asynchronous_standby_fails_typed_never_silently(
    postgres_standby: PostgresPair,
    kafka: KafkaEndpoint,
    kafka_topic: str,
    spark: Any,
    job_id: str,
    tmp_path: Path,
    step: str,
) -> None:
    pair = postgres_standby
    job = make_job(pair, "async", kafka, spark, kafka_topic, job_id, tmp_path)
    hold = pair.hold_wal()
    took: list[float] = []
    triggers = [
        Trigger(HIT_EPOCH, "epoch-start", Fault("WAL stream held back", hold.__enter__)),
        Trigger(HIT_EPOCH, step, failover(pair, took)),
    ]
    writer = job.writer(triggers)
    try:
        job.run(writer)
        live = None
    except Exception:  # noqa: BLE001 (the query's failure; its typed cause is checked below)
        live = writer.last_error
    finally:
        hold.__exit__(None, None, None)
    assert all(trigger.fired_at is not None for trigger in triggers)
    print(f"\nasync failover at {step}: live error {type(live).__name__}: {live}")

    # Batch 1's rows never reached the standby. Whether the run saw it or not, the next run
    # refuses to go on over the gap (at its start, or at the replay of the batch whose
    # decision is not finished), naming the sink and the epoch.
    if live is not None:
        assert isinstance(live, ParticipantLostError), live
        assert_names_the_loss(live)
    at_start = restart_fails(job)
    assert_names_the_loss(at_start)
    print(f"at the next start: {type(at_start).__name__}: {at_start}")
    held = postgres_ids(job.bed.postgres_direct.conninfo(), job.table)
    assert len(held) == len(set(held)) == ROWS_PER_BATCH  # batch 0's, once; batch 1's gone

    # The documented repair (docs/reliability.md, "Lost committed epochs"): the old primary
    # started alone, the lost epochs copied from it; then the job restarts and lands every
    # batch once.
    with pair.retired_alone() as old:
        repaired = repair_from(job, tmp_path, old)
    print(repaired)
    restarted = job.writer()
    job.run(restarted)
    job.check_exactly_once()


def repair_from(job: Job, folder: Path, old: PostgresEndpoint) -> str:
    """The lost epochs of the job's Postgres sink copied from `old` (repair-epochs --from)."""
    sinks: list[dict[str, Any]] = [{"kind": "postgres", "dsn": "${env:JOB_PG}", "table": job.table}]
    if job.topic is not None:
        kafka = job.bed.job_kafka.bootstrap_servers
        sinks.append({"kind": "kafka", "bootstrap_servers": kafka, "topic": job.topic})
    env = {"JOB_PG": job.bed.job_postgres.conninfo(), "OLD_PG": old.conninfo()}
    job_file = write_job_file(folder, {"job_id": job.job_id, "sinks": sinks})
    result = repair_epochs(job_file, job.job_id, env, "--from", "${env:OLD_PG}", "--apply")
    assert result.exit_code == 0, result.output
    return result.output


def restart_fails(job: Job) -> ParticipantLostError:
    """Start the job again (its writer, then its query): the typed error it fails with."""
    try:
        restarted = job.writer()
    except ParticipantLostError as at_start:
        return at_start
    with pytest.raises(Exception, match=r"ParticipantLostError|CommittedEpochLostError"):
        job.run(restarted)
    found = restarted.last_error
    assert isinstance(found, ParticipantLostError), found
    return found


def assert_names_the_loss(error: ParticipantLostError) -> None:
    assert error.sink == "postgres", error
    lost = (
        (error.first_lost, error.last_lost)
        if isinstance(error, CommittedEpochLostError)
        else (error.epoch, error.epoch)
    )
    assert lost[0] is not None, error
    assert lost[1] is not None, error
    assert lost[0] <= HIT_EPOCH <= lost[1], error
    text = str(error)
    assert "asynchronous standby" in text, text
    assert "repair-epochs" in (error.fix or ""), error.fix
    assert "password" not in text


@pytest.mark.parametrize("step", ["epoch-start", "after-decision"])
def test_executor_mode_rides_a_failover_to_a_synchronous_standby_through(
    postgres_standby: PostgresPair,
    kafka: KafkaEndpoint,
    spark: Any,
    job_id: str,
    tmp_path: Path,
    step: str,
) -> None:
    """The batch's tasks connect by the pair's conninfo too: before the failover's batch,
    to the old primary; after it, to the promoted standby."""
    job = make_job(postgres_standby, "sync", kafka, spark, None, job_id, tmp_path)
    job.options = {"execution": "executor"}
    took: list[float] = []
    triggers = [Trigger(HIT_EPOCH, step, failover(postgres_standby, took))]
    writer = job.writer(triggers)
    job.run(writer)
    check_ridden_through(writer, triggers)
    report_pause(writer, triggers[0], took)
    job.check_exactly_once()
