"""The conformance suite against the Iceberg sink: a table of pyiceberg's SQL catalog (in a
schema of its own in the test bed's Postgres) with a local warehouse, alone. After every
settled step no data file lies outside the current snapshot and each epoch has one commit (the
target's `leftovers`, tests/support/iceberg_target.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from durable_sinks.manifest import DecisionStore, LocalDirectoryStore
from durable_sinks.testing import EXAMPLES_ENV, Scenario, run_conformance
from tests.crash.test_file_sink_conformance import check_exercised
from tests.services import PostgresEndpoint
from tests.support.iceberg_target import IcebergCatalog, IcebergTarget
from tests.support.tiers import CONFORMANCE_SAMPLE

TIME_LIMIT = max(1800, 10 * int(os.environ.get(EXAMPLES_ENV) or 0))


@pytest.fixture
def catalog(postgres: PostgresEndpoint, tmp_path: Path) -> Iterator[IcebergCatalog]:
    made = IcebergCatalog(postgres, tmp_path)
    made.create_namespace()
    try:
        yield made
    finally:
        made.drop()


def scenario_of(catalog: IcebergCatalog) -> Callable[[], Scenario]:
    def make() -> Scenario:
        folder = Path(tempfile.mkdtemp(prefix="ds-iceberg-conformance-"))
        job = f"icebergconf-{uuid.uuid4().hex[:10]}"
        target = IcebergTarget(catalog)

        def cleanup() -> None:
            problems = target.leftovers()
            epochs = target.committed_epochs()
            target.cleanup()
            shutil.rmtree(folder, ignore_errors=True)
            assert not problems, f"left behind: {problems}"
            assert epochs == sorted(set(epochs)), f"not one commit per epoch: {epochs}"

        def store() -> DecisionStore:
            return LocalDirectoryStore(folder / "store")

        return Scenario(job, [target], store, cleanup)

    return make


@pytest.mark.timeout(TIME_LIMIT)
def test_iceberg_sink_alone(catalog: IcebergCatalog) -> None:
    stats = run_conformance(scenario_of(catalog), max_examples=CONFORMANCE_SAMPLE)
    check_exercised(stats)


def test_the_target_sees_a_prepared_participant_as_a_leftover(catalog: IcebergCatalog) -> None:
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
    assert [p.split(" ")[0] for p in target.leftovers()] == ["data"]
    sink.rollback_epoch(0, handle)
    assert target.leftovers() == []
    target.cleanup()
