"""Two drivers under one job id at once: the old one is partitioned away (Toxiproxy cuts every
connection it has), a new one takes the job over and writes on, then the partition heals. The
old driver must be fenced everywhere: it never commits, never takes the job back by riding
out its outage, and nothing of the two interleaves. Postgres with Kafka, and Kafka alone with
no decision store (its progress topic keeps the decisions and the generations)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durable_sinks.core.errors import FencedError
from durable_sinks.spark import DurableBatchWriter, durable_sink
from tests.support.fault_bed import FaultBed

from .jobs import ROWS_PER_BATCH, Fault, Job, Trigger

SCHEMA = "id LONG, body STRING"


def batch(spark: Any, epoch: int) -> Any:
    rows = [(i, f"row {i}") for i in range(epoch * ROWS_PER_BATCH, (epoch + 1) * ROWS_PER_BATCH)]
    return spark.createDataFrame(rows, SCHEMA)


@pytest.mark.parametrize(
    ("step", "postgres"),
    [
        # the old driver's next call fails on a cut connection: its ride-out must not start a
        # coordinator that fences the new driver
        ("after-write:0:postgres", True),
        # the old driver reaches the commit point (its Kafka commit) after the new one started
        ("after-pre-commit:kafka", True),
        # Kafka alone, no decision store: generations are claimed in the progress topic
        ("after-write:0:kafka", False),
        ("after-pre-commit:kafka", False),
    ],
)
def test_the_older_of_two_drivers_is_fenced_and_nothing_interleaves(
    fault_bed: FaultBed,
    spark: Any,
    fault_pg_schema: str,
    fault_kafka_topic: str,
    job_id: str,
    tmp_path: Path,
    step: str,
    postgres: bool,
) -> None:
    job = Job(
        fault_bed,
        spark,
        fault_pg_schema,
        fault_kafka_topic,
        job_id,
        tmp_path,
        batches=4,
        postgres=postgres,
    )
    job.options = {"outage_tolerance_s": 60.0}
    new_driver: list[DurableBatchWriter] = []

    def partition_and_take_over() -> None:
        """The old driver is cut off; a new driver starts (fencing it, recovering its
        leftovers) and writes batches 1 and 2; then the partition heals."""
        fault_bed.postgres_proxy.disable()
        fault_bed.kafka_proxy.disable()
        new = durable_sink(job.sinks(proxied=False), job_id=job_id, **job.options)
        new_driver.append(new)
        new(batch(spark, 1), 1)
        new(batch(spark, 2), 2)
        fault_bed.postgres_proxy.enable()
        fault_bed.kafka_proxy.enable()

    old = job.writer([Trigger(1, step, Fault("partition", partition_and_take_over))])
    old(batch(spark, 0), 0)
    with pytest.raises(FencedError):
        old(batch(spark, 1), 1)
    assert old.triggers[0].fired_at is not None

    # The new driver still owns the job: the old one took nothing back.
    (new,) = new_driver
    new(batch(spark, 3), 3)
    assert new.last_result is not None
    assert new.last_result.epoch == 3

    job.check_exactly_once()  # batches 0-3 once in both sinks, nothing prepared or open
    old.close()
    new.close()
