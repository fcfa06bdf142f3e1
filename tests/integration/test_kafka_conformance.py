"""The conformance suite against the test bed's real Kafka, read by a read_committed consumer:
the Kafka sink alone (its transaction's commit is the commit point), alone with no decision
store (its progress topic keeps the job's decisions and generations) and as the last
resource of a job with Postgres. After every example no transaction is left open (every last stable
offset reaches its high watermark) and no prepared Postgres transaction is left."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from durable_sinks.manifest import DecisionStore, HostedDecisionStore, LocalDirectoryStore
from durable_sinks.sinks.kafka import KafkaSink
from durable_sinks.testing import EXAMPLES_ENV, Scenario, Target, run_conformance
from tests.crash.test_file_sink_conformance import check_exercised
from tests.services import KafkaEndpoint, PostgresEndpoint
from tests.support.targets import KafkaTarget, PostgresTarget, create_topic
from tests.support.tiers import CONFORMANCE_SAMPLE

#: A Kafka example costs ~3 s (each restart after a crash waits ~0.55 s in
#: init_transactions): a time limit that grows with the example count of the run.
TIME_LIMIT = max(1800, 10 * int(os.environ.get(EXAMPLES_ENV) or 0))

#: Kafka's commit is the decision and nothing is prepared to resolve at recovery.
KAFKA_ALONE_ABSENT = frozenset({"after-commit", "recovery:after-resolve"})


@pytest.fixture
def progress_topic(admin: AdminClient) -> Iterator[str]:
    """One compacted progress topic for the test's examples (they differ by job id)."""
    name = f"kconf-progress-{uuid.uuid4().hex[:10]}"
    create_topic(admin, name, 1, **{"cleanup.policy": "compact"})
    yield name
    for future in admin.delete_topics([name], request_timeout=30).values():
        future.result(timeout=30)


def scenario_of(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    progress_topic: str,
    postgres: tuple[PostgresEndpoint, str] | None = None,
    *,
    hosted: bool = False,
) -> Callable[[], Scenario]:
    """With `hosted`, the job has no decision store of its own: Kafka keeps its decisions
    and generations in the progress topic (HostedDecisionStore)."""

    def make() -> Scenario:
        folder = Path(tempfile.mkdtemp(prefix="ds-kafka-conformance-"))
        job = f"kconf-{uuid.uuid4().hex[:10]}"
        kafka_target = KafkaTarget(kafka, admin, progress_topic)
        targets: list[Target] = [kafka_target]
        if postgres is not None:
            targets.insert(0, PostgresTarget(*postgres, job))

        def cleanup() -> None:
            problems: list[str] = []
            for target in targets:
                problems += target.leftovers()
                if isinstance(target, (KafkaTarget, PostgresTarget)):
                    target.cleanup()
            shutil.rmtree(folder, ignore_errors=True)
            assert not problems, f"left behind: {problems}"

        def store() -> DecisionStore:
            if hosted:
                return HostedDecisionStore(KafkaSink(kafka_target.config()).decision_host())
            return LocalDirectoryStore(folder / "store")

        return Scenario(job, targets, store, cleanup)

    return make


# The crash tier's (make test-crash, CI's rotation): Kafka alone without a decision store (the
# default for a lone Kafka sink) and Postgres + Kafka (with a store) are the default suite's.
@pytest.mark.crash_tier
@pytest.mark.timeout(TIME_LIMIT)
def test_kafka_sink_alone(kafka: KafkaEndpoint, admin: AdminClient, progress_topic: str) -> None:
    stats = run_conformance(
        scenario_of(kafka, admin, progress_topic), max_examples=CONFORMANCE_SAMPLE
    )
    check_exercised(stats, without=KAFKA_ALONE_ABSENT)


@pytest.mark.timeout(TIME_LIMIT)
def test_kafka_sink_alone_without_a_decision_store(
    kafka: KafkaEndpoint, admin: AdminClient, progress_topic: str
) -> None:
    """Generations are claimed and decisions read back in the progress topic; crashed,
    restarted and zombie coordinators meet the same invariants."""
    stats = run_conformance(
        scenario_of(kafka, admin, progress_topic, hosted=True), max_examples=CONFORMANCE_SAMPLE
    )
    check_exercised(stats, without=KAFKA_ALONE_ABSENT)


@pytest.mark.timeout(TIME_LIMIT)
def test_postgres_and_kafka_in_one_job(
    kafka: KafkaEndpoint,
    admin: AdminClient,
    progress_topic: str,
    postgres: PostgresEndpoint,
    pg_schema: str,
) -> None:
    """Postgres is prepared, Kafka's commit carries the decision, then Postgres commits;
    recovery reads the decision back from the progress topic."""
    scenario = scenario_of(kafka, admin, progress_topic, (postgres, pg_schema))
    stats = run_conformance(scenario, max_examples=CONFORMANCE_SAMPLE)
    check_exercised(stats)
