"""The conformance suite against the Delta sink: a local table alone (append, and merge by
key), in one job with Postgres and Kafka (as the last resource), and a table in the test bed's
S3 server; alone, locally and on S3, also with the decision store a job naming none gets (in
the table's folder). Readers read the table with delta-rs; after every settled step no
journal is left, no data file lies outside every committed version, and each epoch has one
commit (the target's `leftovers`, tests/support/delta_target.py)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from durable_sinks.manifest import DecisionStore, LocalDirectoryStore, default_store_for
from durable_sinks.testing import EXAMPLES_ENV, Scenario, Target, run_conformance
from tests.crash.test_file_sink_conformance import check_exercised
from tests.integration.test_kafka_conformance import progress_topic  # noqa: F401 - fixture
from tests.services import KafkaEndpoint, PostgresEndpoint, S3Endpoint
from tests.support.delta_target import DeltaTarget
from tests.support.targets import KafkaTarget, PostgresTarget
from tests.support.tiers import CONFORMANCE_SAMPLE

TIME_LIMIT = max(1800, 10 * int(os.environ.get(EXAMPLES_ENV) or 0))


def scenario_of(
    *,
    s3: S3Endpoint | None = None,
    postgres: tuple[PostgresEndpoint, str] | None = None,
    kafka: tuple[KafkaEndpoint, AdminClient, str] | None = None,
    beside_table: bool = False,
    **options: Any,
) -> Callable[[], Scenario]:
    """With `beside_table`, the job names no decision store: it is the one a job gets from
    its Delta sink (`_decisions` in the table's folder)."""

    def make() -> Scenario:
        folder = Path(tempfile.mkdtemp(prefix="ds-delta-conformance-"))
        job = f"deltaconf-{uuid.uuid4().hex[:10]}"
        delta = DeltaTarget(s3=s3, **options)
        targets: list[Target] = [delta]
        if postgres is not None:
            targets.append(PostgresTarget(*postgres, job))
        if kafka is not None:
            targets.append(KafkaTarget(*kafka))

        def cleanup() -> None:
            problems: list[str] = []
            for target in targets:
                problems += target.leftovers()
            epochs = delta.committed_epochs()
            for target in targets:
                if isinstance(target, DeltaTarget | PostgresTarget | KafkaTarget):
                    target.cleanup()
            shutil.rmtree(folder, ignore_errors=True)
            assert not problems, f"left behind: {problems}"
            assert epochs == sorted(set(epochs)), f"not one commit per epoch: {epochs}"

        def store() -> DecisionStore:
            if beside_table:
                found = default_store_for("delta", dataclasses.asdict(delta.config()))
                assert found is not None
                return found
            return LocalDirectoryStore(folder / "store")

        return Scenario(job, targets, store, cleanup)

    return make


@pytest.mark.timeout(TIME_LIMIT)
def test_delta_sink_alone() -> None:
    stats = run_conformance(scenario_of(), max_examples=CONFORMANCE_SAMPLE)
    check_exercised(stats)


@pytest.mark.timeout(TIME_LIMIT)
def test_delta_sink_alone_without_a_decision_store() -> None:
    stats = run_conformance(scenario_of(beside_table=True), max_examples=CONFORMANCE_SAMPLE)
    check_exercised(stats)


@pytest.mark.timeout(TIME_LIMIT)
def test_delta_sink_on_s3_without_a_decision_store(s3: S3Endpoint) -> None:
    """The store in the table's S3 prefix (conditional writes of the test bed's server)."""
    stats = run_conformance(scenario_of(s3=s3, beside_table=True), max_examples=CONFORMANCE_SAMPLE)
    check_exercised(stats)


@pytest.mark.timeout(TIME_LIMIT)
def test_delta_sink_merge_by_key() -> None:
    stats = run_conformance(
        scenario_of(mode="upsert", key=("key",)), max_examples=CONFORMANCE_SAMPLE
    )
    check_exercised(stats)


@pytest.mark.timeout(TIME_LIMIT)
def test_delta_postgres_and_kafka_in_one_job(
    postgres: PostgresEndpoint,
    pg_schema: str,
    kafka: KafkaEndpoint,
    admin: AdminClient,
    progress_topic: str,  # noqa: F811 - the fixture imported above
) -> None:
    stats = run_conformance(
        scenario_of(postgres=(postgres, pg_schema), kafka=(kafka, admin, progress_topic)),
        max_examples=CONFORMANCE_SAMPLE,
    )
    check_exercised(stats)


# The crash tier's (make test-crash, CI's rotation): Delta on S3 without a decision store and
# the local table with one are the default suite's.
@pytest.mark.crash_tier
@pytest.mark.timeout(TIME_LIMIT)
def test_delta_sink_on_s3(s3: S3Endpoint) -> None:
    """The same on S3 (SeaweedFS): its storage paths and delta-rs's conditional-write
    commits."""
    stats = run_conformance(scenario_of(s3=s3), max_examples=CONFORMANCE_SAMPLE)
    check_exercised(stats)
