"""The conformance suite against the Iceberg sink, on pyiceberg's SQL catalog (a schema of its
own in the test bed's Postgres, a local warehouse) and on the test bed's SeaweedFS Iceberg REST
catalog (data files on S3): alone, and in one job with Postgres and Kafka (as the last
resource). After every settled step no data file lies outside the current snapshot and each
epoch has one commit (the target's `leftovers`, tests/support/iceberg_target.py).

The default suite runs the SQL catalog alone; the others (`crash_tier`, about 95 s each with
the default counts) run where DS_CONFORMANCE_EXAMPLES is set (`make test-crash`)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from durable_sinks.manifest import DecisionStore, LocalDirectoryStore
from durable_sinks.testing import EXAMPLES_ENV, Scenario, Target, run_conformance
from tests.crash.test_file_sink_conformance import check_exercised
from tests.integration.test_kafka_conformance import progress_topic  # noqa: F401 - fixture
from tests.services import KafkaEndpoint, PostgresEndpoint
from tests.support.iceberg_target import (
    CatalogUnderTest,
    IcebergCatalog,
    IcebergTarget,
    RestIcebergCatalog,
)
from tests.support.targets import KafkaTarget, PostgresTarget
from tests.support.tiers import CONFORMANCE_SAMPLE

TIME_LIMIT = max(1800, 10 * int(os.environ.get(EXAMPLES_ENV) or 0))


@pytest.fixture(params=["sql", "rest"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CatalogUnderTest]:
    made: CatalogUnderTest
    if request.param == "sql":
        made = IcebergCatalog(request.getfixturevalue("postgres"), tmp_path)
    else:
        made = RestIcebergCatalog(request.getfixturevalue("iceberg_rest"))
    made.create_namespace()
    try:
        yield made
    finally:
        made.drop()


def scenario_of(
    catalog: CatalogUnderTest,
    *,
    postgres: tuple[PostgresEndpoint, str] | None = None,
    kafka: tuple[KafkaEndpoint, AdminClient, str] | None = None,
) -> Callable[[], Scenario]:
    def make() -> Scenario:
        folder = Path(tempfile.mkdtemp(prefix="ds-iceberg-conformance-"))
        job = f"icebergconf-{uuid.uuid4().hex[:10]}"
        iceberg = IcebergTarget(catalog)
        targets: list[Target] = [iceberg]
        if postgres is not None:
            targets.append(PostgresTarget(*postgres, job))
        if kafka is not None:
            targets.append(KafkaTarget(*kafka))

        def cleanup() -> None:
            problems: list[str] = []
            for target in targets:
                problems += target.leftovers()
            epochs = iceberg.committed_epochs()
            for target in targets:
                if isinstance(target, IcebergTarget | PostgresTarget | KafkaTarget):
                    target.cleanup()
            shutil.rmtree(folder, ignore_errors=True)
            assert not problems, f"left behind: {problems}"
            assert epochs == sorted(set(epochs)), f"not one commit per epoch: {epochs}"

        def store() -> DecisionStore:
            return LocalDirectoryStore(folder / "store")

        return Scenario(job, targets, store, cleanup)

    return make


@pytest.mark.timeout(TIME_LIMIT)
@pytest.mark.parametrize(
    "catalog", ["sql", pytest.param("rest", marks=pytest.mark.crash_tier)], indirect=True
)
def test_iceberg_sink_alone(catalog: CatalogUnderTest) -> None:
    stats = run_conformance(scenario_of(catalog), max_examples=CONFORMANCE_SAMPLE)
    check_exercised(stats)


@pytest.mark.timeout(TIME_LIMIT)
@pytest.mark.crash_tier
def test_iceberg_postgres_and_kafka_in_one_job(
    catalog: CatalogUnderTest,
    postgres: PostgresEndpoint,
    pg_schema: str,
    kafka: KafkaEndpoint,
    admin: AdminClient,
    progress_topic: str,  # noqa: F811 - the fixture imported above
) -> None:
    stats = run_conformance(
        scenario_of(catalog, postgres=(postgres, pg_schema), kafka=(kafka, admin, progress_topic)),
        max_examples=CONFORMANCE_SAMPLE,
    )
    check_exercised(stats)


def test_the_target_sees_a_prepared_participant_as_a_leftover(catalog: CatalogUnderTest) -> None:
    """The check above is not vacuous: files no snapshot references are reported."""
    import pyarrow as pa

    from durable_sinks.core.protocol import OpenContext
    from durable_sinks.testing import SCHEMA

    target = IcebergTarget(catalog)
    sink = target.connector()
    sink.open(OpenContext("leftover", sink.name, 1))
    sink.begin_epoch(0)
    sink.write_batch(pa.record_batch([pa.array(["k"]), [1], ["t"], [0.5], [True]], schema=SCHEMA))
    handle = sink.pre_commit(0)
    # Its data file and its entry in the epoch journal (written before the file).
    assert [p.split(" ")[0] for p in target.leftovers()] == ["data", "epoch"]
    sink.rollback_epoch(0, handle)
    assert target.leftovers() == []
    target.cleanup()
