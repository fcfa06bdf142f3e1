"""`durable-sinks verify` on a Kafka job with the sink's defaults (no epoch header): each
epoch's committed records are counted in the offset ranges its progress record names, so
the audit proves every epoch once, per epoch; a rolled-back attempt is not counted, and
another writer of the topic neither passes for the epoch's records nor fails the audit."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from click.testing import CliRunner
from confluent_kafka import Producer

from durable_sinks.cli import main
from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.spark import sink
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint
from tests.support.coordinators import run_until


def rows(start: int, count: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + count), pa.int64())})


def another_writer(kafka: KafkaEndpoint, topic: str, count: int) -> None:
    """`count` records from a producer of its own (no transaction, no header), acknowledged."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for n in range(count):
        producer.produce(topic, b'{"id":-1}', partition=n % 2)
    assert producer.flush(10) == 0


def test_verify_counts_each_epoch_in_its_offset_ranges(
    tmp_path: Path, kafka: KafkaEndpoint, topic: str, unique: UniqueNames
) -> None:
    options = {"bootstrap_servers": kafka.bootstrap_servers, "topic": topic}
    store = tmp_path / "decisions"

    def coordinator() -> Coordinator:
        made = Coordinator(
            unique.job_id, [sink("kafka", **options).build()], LocalDirectoryStore(store)
        )
        made.start()
        return made

    first = coordinator()
    for epoch in range(2):
        first.run_epoch(epoch, [rows(epoch * 10, 6), rows(epoch * 10 + 6, 4)])
    another_writer(kafka, topic, 3)  # between epochs: outside every epoch's ranges
    # Epoch 2's first attempt: every record acknowledged, then the driver dies.
    crashed = first.epoch_steps(2, [rows(20, 10)])
    run_until(crashed, "after-pre-commit:kafka")
    second = coordinator()  # its init_transactions aborts the attempt
    assert second.run_epoch(2, [rows(20, 10)]).outcome is EpochOutcome.COMMITTED
    # Epoch 3: another producer writes while the epoch's transaction is open.
    during = second.epoch_steps(3, [rows(30, 10)])
    run_until(during, "after-pre-commit:kafka")
    another_writer(kafka, topic, 2)
    for _ in during:
        pass
    second.close()
    first.close()

    job_file = tmp_path / "job.json"
    job_file.write_text(
        json.dumps(
            {
                "job_id": unique.job_id,
                "decision_store": str(store),
                "sinks": [{"kind": "kafka", **options}],
            }
        )
    )
    verified = CliRunner().invoke(main, ["verify", unique.job_id, "-f", str(job_file)])
    assert verified.exit_code == 0, verified.output
    lines = verified.output.splitlines()
    # The aborted attempt's 10 records and the other writer's 3 are not counted; epoch 3's
    # ranges also hold the other writer's 2 records: its rows come from its markers.
    assert sum("10 rows counted" in line for line in lines) == 3, verified.output
    assert sum("10 rows in markers" in line for line in lines) == 1, verified.output
