"""The Postgres sink and decision store given a primary and standby's multi-host DSN
(`postgres-standby`), driven by the coordinator without Spark: after a failover to a
synchronous standby a new coordinator finds its decisions and the sink's epochs there and
goes on; after a failover to an asynchronous standby that missed the last epoch, the sink's
session that replaces the lost one refuses to go on (CommittedEpochLostError naming both
servers, never the password), and the repair copies the lost epoch from the old primary.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core.errors import CommittedEpochLostError, DurableSinkError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.conftest import UniqueNames
from tests.services import PostgresPair
from tests.spark.streams import postgres_ids
from tests.support.operator_cli import repair_epochs, write_job_file

pytestmark = pytest.mark.replicated_tier

TABLE = "standby.events"


def batch(epoch: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array([epoch * 10, epoch * 10 + 1], pa.int64())})


def fresh_pair(pair: PostgresPair, mode: str) -> str:
    """A fresh pair in `mode` with the job's schema; its multi-host DSN."""
    pair.reset(mode)  # type: ignore[arg-type]
    dsn = pair.endpoint().conninfo()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA standby")
    return dsn


def sink_on(dsn: str) -> PostgresSink:
    return PostgresSink(Postgres(dsn, TABLE, create_table=True))


def test_a_job_on_a_synchronous_pair_goes_on_after_a_failover_with_its_decisions(
    postgres_standby: PostgresPair, unique: UniqueNames
) -> None:
    dsn = fresh_pair(postgres_standby, "sync")
    store = PostgresDecisionStore(dsn, schema="standby")
    first = Coordinator(unique.job_id, [sink_on(dsn)], store, one_phase=False)
    first.start()
    first.run_epoch(0, [batch(0)])
    first.run_epoch(1, [batch(1)])
    postgres_standby.fail_over()
    first.close()

    again = Coordinator(
        unique.job_id, [sink_on(dsn)], PostgresDecisionStore(dsn, schema="standby"), one_phase=False
    )
    again.start()  # the store and the sink both reach the promoted standby
    assert again.run_epoch(1, [batch(1)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert again.run_epoch(2, [batch(2)]).outcome is EpochOutcome.COMMITTED
    again.close()
    assert postgres_ids(dsn, TABLE) == [0, 1, 10, 11, 20, 21]


def test_a_session_replaced_after_a_failover_to_a_lagging_standby_refuses_to_go_on(
    postgres_standby: PostgresPair, unique: UniqueNames, tmp_path: Path
) -> None:
    pair = postgres_standby
    dsn = fresh_pair(pair, "async")
    sink = sink_on(dsn)
    coordinator = Coordinator(
        unique.job_id, [sink], LocalDirectoryStore(tmp_path / "store"), one_phase=False
    )
    coordinator.start()
    coordinator.run_epoch(0, [batch(0)])
    with pair.hold_wal():
        coordinator.run_epoch(1, [batch(1)])  # committed on the primary alone
        pair.fail_over()

    with pytest.raises(DurableSinkError) as lost_session:
        sink.begin_epoch(2)  # its session died with the old primary
    assert lost_session.value.retriable
    for _ in range(2):  # each replacement is checked, until the epochs are repaired
        with pytest.raises(CommittedEpochLostError) as caught:
            sink.begin_epoch(2)
        error = caught.value
        assert (error.first_lost, error.last_lost, error.holder) == (1, 1, "postgres")
        servers = ",".join(f"127.0.0.1:{server.port}" for server in pair.servers.values())
        assert f"({servers}/postgres)" in str(error)
        assert pair.endpoint().password not in str(error) + str(error.fix)
        assert "repair-epochs" in (error.fix or "")
    assert postgres_ids(dsn, TABLE) == [0, 1]  # nothing of epoch 2 written
    coordinator.close()


def test_epochs_a_failover_to_a_lagging_standby_lost_are_repaired_from_the_old_primary(
    postgres_standby: PostgresPair, unique: UniqueNames, tmp_path: Path
) -> None:
    """The documented repair (docs/reliability.md, "Lost committed epochs") after a real
    failover: the next start refuses; the old primary, started alone, gives back the lost
    epoch (`durable-sinks repair-epochs --from`); the job then goes on, every row once."""
    pair = postgres_standby
    dsn = fresh_pair(pair, "async")
    store = tmp_path / "store"

    def started() -> Coordinator:
        """A new coordinator, started; closed if its start fails (as the Spark writer does)."""
        made = Coordinator(
            unique.job_id, [sink_on(dsn)], LocalDirectoryStore(store), one_phase=False
        )
        try:
            made.start()
        except BaseException:
            made.close()
            raise
        return made

    first = started()
    first.run_epoch(0, [batch(0)])
    with pair.hold_wal():
        first.run_epoch(1, [batch(1)])
        pair.fail_over()
    first.close()
    with pytest.raises(CommittedEpochLostError) as caught:
        started()
    assert (caught.value.first_lost, caught.value.last_lost) == (1, 1)

    settings = {
        "job_id": unique.job_id,
        "decision_store": str(store),
        "sinks": [{"kind": "postgres", "dsn": "${env:JOB_PG}", "table": TABLE}],
    }
    with pair.retired_alone() as old:
        env = {"JOB_PG": dsn, "OLD_PG": old.conninfo()}
        job_file = write_job_file(tmp_path, settings)
        result = repair_epochs(job_file, unique.job_id, env, "--from", "${env:OLD_PG}", "--apply")
    assert result.exit_code == 0, result.output
    shown = result.output
    assert "repaired 1 epoch(s) of sink postgres" in shown, shown

    again = started()
    assert again.run_epoch(2, [batch(2)]).outcome is EpochOutcome.COMMITTED
    again.close()
    assert postgres_ids(dsn, TABLE) == [0, 1, 10, 11, 20, 21]
