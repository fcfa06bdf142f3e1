"""The conformance suite against the test bed's S3 server (SeaweedFS): the S3 sink alone, with
Postgres, and with Kafka (as the last resource); and the S3 sink alone against moto's server.
Readers read the epoch markers and the objects they list; after every example no multipart
upload of the job is left in progress and no data object lies outside a committed epoch."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.testing import (
    EXAMPLES_ENV,
    Scenario,
    Target,
    epoch_rows,
    run_conformance,
    to_batches,
)
from tests.crash.test_file_sink_conformance import check_exercised
from tests.integration.test_kafka_conformance import progress_topic  # noqa: F401 - fixture
from tests.services import KafkaEndpoint, PostgresEndpoint, S3Endpoint
from tests.support.s3_target import S3Target
from tests.support.targets import KafkaTarget, PostgresTarget
from tests.support.tiers import CONFORMANCE_SAMPLE

TIME_LIMIT = max(1800, 10 * int(os.environ.get(EXAMPLES_ENV) or 0))


def scenario_of(
    s3: S3Endpoint,
    *,
    postgres: tuple[PostgresEndpoint, str] | None = None,
    kafka: tuple[KafkaEndpoint, AdminClient, str] | None = None,
    **options: Any,
) -> Callable[[], Scenario]:
    def make() -> Scenario:
        folder = Path(tempfile.mkdtemp(prefix="ds-s3-conformance-"))
        job = f"s3conf-{uuid.uuid4().hex[:10]}"
        targets: list[Target] = [S3Target(s3, **options)]
        if postgres is not None:
            targets.append(PostgresTarget(*postgres, job))
        if kafka is not None:
            targets.append(KafkaTarget(*kafka))

        def cleanup() -> None:
            problems: list[str] = []
            for target in targets:
                problems += target.leftovers()
                if isinstance(target, S3Target | PostgresTarget | KafkaTarget):
                    target.cleanup()
            shutil.rmtree(folder, ignore_errors=True)
            assert not problems, f"left behind: {problems}"

        return Scenario(job, targets, lambda: LocalDirectoryStore(folder / "store"), cleanup)

    return make


def test_the_target_sees_what_readers_see_and_what_is_left_behind(
    s3: S3Endpoint, tmp_path: Path
) -> None:
    """The suite's view of the sink can fail: rows of a marker no longer listed disappear,
    a data object outside every epoch and an upload in progress are named as left behind."""
    target = S3Target(s3)
    coordinator = Coordinator("job", [target.connector()], LocalDirectoryStore(tmp_path))
    coordinator.start()
    rows = epoch_rows(0, [[(1, "a", 0.5, True), (2, "b", None, False)]])
    assert coordinator.run_epoch(0, to_batches(rows)).outcome is EpochOutcome.COMMITTED
    coordinator.close()
    try:
        assert sorted(target.committed_rows()) == sorted(rows[0])
        assert target.leftovers() == []
        client, bucket = target.client, target.bucket
        stray = f"{target.prefix}/epoch=7/stray.parquet"
        client.put_object(Bucket=bucket, Key=stray, Body=b"x")
        upload = client.create_multipart_upload(Bucket=bucket, Key=f"{target.prefix}/epoch=8/u")
        assert target.leftovers() == [
            f"{target.prefix}/epoch=8/u ({upload['UploadId']})",
            f"{stray} (outside every committed epoch)",
        ]
        [marker] = target.markers()
        client.delete_object(Bucket=bucket, Key=marker)
        assert target.committed_rows() == []
    finally:
        target.cleanup()


@pytest.mark.timeout(TIME_LIMIT)
def test_s3_sink_alone(s3: S3Endpoint) -> None:
    stats = run_conformance(scenario_of(s3), max_examples=CONFORMANCE_SAMPLE)
    check_exercised(stats)


# The crash tier's (make test-crash, CI's rotation); the S3 sink alone on SeaweedFS is the
# default suite's.
@pytest.mark.crash_tier
@pytest.mark.timeout(TIME_LIMIT)
def test_s3_sink_alone_on_moto(moto_s3: S3Endpoint) -> None:
    """The same run against a second, independent S3 implementation (moto's server), so the
    sink relies on S3's semantics rather than SeaweedFS's."""
    stats = run_conformance(scenario_of(moto_s3), max_examples=CONFORMANCE_SAMPLE)
    check_exercised(stats)


@pytest.mark.timeout(TIME_LIMIT)
def test_s3_and_postgres_in_one_job(
    s3: S3Endpoint, postgres: PostgresEndpoint, pg_schema: str
) -> None:
    stats = run_conformance(
        scenario_of(s3, postgres=(postgres, pg_schema)), max_examples=CONFORMANCE_SAMPLE
    )
    check_exercised(stats)


@pytest.mark.timeout(TIME_LIMIT)
@pytest.mark.crash_tier  # (~45 s) Kafka's commit point stays in the default suite with
# Postgres and with Delta + Postgres (test_kafka_conformance.py, test_delta_conformance.py)
def test_s3_and_kafka_in_one_job(
    s3: S3Endpoint,
    kafka: KafkaEndpoint,
    admin: AdminClient,
    progress_topic: str,  # noqa: F811 - the fixture imported above
) -> None:
    stats = run_conformance(
        scenario_of(s3, kafka=(kafka, admin, progress_topic)), max_examples=CONFORMANCE_SAMPLE
    )
    check_exercised(stats)
