"""`durable-sinks drop` on a Kafka progress topic shared by two jobs, on the test bed's
broker: both jobs are Kafka-only (their decisions and generations are their progress records:
the hosted store). Dropping one job tombstones exactly its records (progress, fence,
generation): a read_committed reader of the topic sees the other job's records as they were,
and the other job goes on after the drop (recovery reads its decisions, a new epoch commits).
The user's topic keeps every record of both jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from click.testing import CliRunner, Result
from confluent_kafka.admin import AdminClient

from durable_sinks.cli import main
from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core.naming import owner_prefix
from durable_sinks.manifest import HostedDecisionStore
from durable_sinks.spark import sink
from durable_sinks.spark._build import decision_store
from durable_sinks.spark._options import JobOptions
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint
from tests.support.coordinators import started
from tests.support.kafka_reads import read_committed


def rows(start: int, count: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + count), pa.int64())})


def latest_by_key(kafka: KafkaEndpoint, topic: str) -> dict[bytes, bytes | None]:
    """The progress topic as a compacted reader sees it: each key's latest committed value
    (None: a tombstone)."""
    latest: dict[bytes, bytes | None] = {}
    for message in read_committed(kafka, AdminClient(kafka.config()), topic):
        key = message.key()
        if key is not None:
            latest[key] = message.value()
    return latest


def test_drop_tombstones_only_its_own_records_in_a_shared_progress_topic(
    kafka: KafkaEndpoint,
    kafka_topic: str,
    progress_topic: str,
    unique: UniqueNames,
    tmp_path: Path,
) -> None:
    options = {
        "bootstrap_servers": kafka.bootstrap_servers,
        "topic": kafka_topic,
        "progress_topic": progress_topic,
    }
    gone, staying = unique.name("job_gone"), unique.name("job_staying")

    def coordinator(job: str) -> Coordinator:
        specs = [sink("kafka", **options)]
        store = decision_store(specs, JobOptions(job_id=job))
        assert isinstance(store, HostedDecisionStore)
        return Coordinator(job, [s.build() for s in specs], store, source="query-1")

    first = started(coordinator(gone))
    first.run_epoch(0, [rows(0, 5)])
    first.close()
    other = started(coordinator(staying))
    for epoch in range(2):
        other.run_epoch(epoch, [rows(100 + 10 * epoch, 2)])
    other.close()

    before = latest_by_key(kafka, progress_topic)
    ours = {k for k in before if k.startswith(owner_prefix(gone, "kafka").encode())}
    theirs = {k: v for k, v in before.items() if k not in ours}
    assert len(ours) == 3  # progress, fence, generation
    assert len(theirs) == 3
    assert all(v is not None for v in before.values())
    user_records = len(read_committed(kafka, AdminClient(kafka.config()), kafka_topic))
    assert user_records == 5 + 2 * 2

    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({"job_id": gone, "kind": "kafka", **options}))

    def run(*args: str) -> Result:
        return CliRunner().invoke(main, [args[0], gone, "-f", str(job_file), *args[1:]])

    alive = run("drop", "--apply")  # its coordinator decided an epoch moments ago
    assert alive.exit_code == 2, alive.output
    assert "seems to run" in alive.output
    dry = run("drop")
    assert dry.exit_code == 0, dry.output
    assert "progress records (tombstones)" in dry.output
    assert "generations and decisions" in dry.output  # the hosted store's: kept, the sink's
    assert "transactional.id" in dry.output
    assert latest_by_key(kafka, progress_topic) == before

    applied = run("drop", "--apply", "--live-window", "0")
    assert applied.exit_code == 0, applied.output
    after = latest_by_key(kafka, progress_topic)
    assert {k: after[k] for k in ours} == dict.fromkeys(ours, None)
    assert {k: v for k, v in after.items() if k not in ours} == theirs
    again = run("drop")
    assert again.exit_code == 0, again.output
    assert "0 kind(s) of bookkeeping" in again.output

    # The other job goes on: its decisions are read back and its next epoch commits.
    resumed = started(coordinator(staying))
    assert resumed.sinks[0].last_committed_epoch() == 1
    assert resumed.decision(1) is not None
    assert resumed.run_epoch(1, [rows(110, 2)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert resumed.run_epoch(2, [rows(120, 2)]).outcome is EpochOutcome.COMMITTED
    resumed.close()
    assert len(read_committed(kafka, AdminClient(kafka.config()), kafka_topic)) == (
        user_records + 2
    )
