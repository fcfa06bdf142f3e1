"""The servers a soak runs against, as the soak sees them: what to start, where the job writes,
where the audit reads, what is left open, how to bring every server back, and the faults.

- The faults bed (`faults_bed`): the faults Postgres and Kafka broker, the job reaching both
  through Toxiproxy (whose links the soak cuts).
- The replicated servers (`replicated_bed`): the three-broker Kafka cluster and the Postgres
  primary + synchronous standby, the job reaching Postgres by a multi-host conninfo (which
  finds whichever server is the primary) and Kafka by all three brokers.

S3 is the bed's SeaweedFS in both (its faults are not the soak's), and the Spark job runs on the
bed's standalone cluster.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from durable_sinks.sinks.kafka.progress import transactional_id
from tests.services import KafkaEndpoint, KafkaTransaction, Testbed
from tests.services._process import tests_lock
from tests.soak.faults import Fault, Target, fault_bed_kinds
from tests.soak.replicated import Replicated, replicated_kinds
from tests.support.fault_bed import FaultBed

#: The servers every soak starts besides its bed's own: S3, Spark's jars, the Spark cluster.
JOB_SERVICES = ("s3", "spark", "spark-cluster")
FAULTS_BED_SERVICES = ("faults", *JOB_SERVICES)
REPLICATED_SERVICES = ("kafka-cluster", "postgres-standby", *JOB_SERVICES)


@dataclass(frozen=True)
class Bed:
    """One bed's servers as the soak uses them (see the module docstring)."""

    job_dsn: str  # the conninfo the job writes Postgres through (holds a password)
    job_bootstrap: str  # the bootstrap servers the job writes Kafka through
    postgres_dsn: str  # where the audit reads Postgres (directly)
    kafka: KafkaEndpoint  # where the audit reads Kafka (directly)
    create_topic: Callable[[str], None]  # the job's topic, one partition, known to every broker
    open_kafka_transactions: Callable[[], list[KafkaTransaction]]
    heal: Callable[[], None]  # every server up and healthy, nothing cut
    kinds: Callable[[Target], dict[str, Fault]]


@contextmanager
def held(testbed: Testbed, *, replicated: bool) -> Iterator[None]:
    """The tests' locks on every server the soak breaks, for as long as it runs: tests of
    them wait, and none breaks the soak's servers under it (a run on its own servers,
    `--own-servers`, holds locks nobody else takes)."""
    with ExitStack() as locks:
        locks.enter_context(tests_lock(testbed.spark_cluster))
        if replicated:
            locks.enter_context(tests_lock(testbed.kafka_cluster))
            locks.enter_context(tests_lock(testbed.postgres_standby))
        else:
            locks.enter_context(FaultBed.of(testbed).exclusive())
        yield


def create_topic(kafka: KafkaEndpoint, topic: str) -> None:
    """`topic` on the single broker `kafka`, one partition, with a leader."""
    from confluent_kafka.admin import AdminClient  # (imported once the servers are up)

    from tests.support.targets import create_topic as create

    create(AdminClient(kafka.config()), topic)


def faults_bed(testbed: Testbed) -> Bed:
    """The faults bed (its servers started: `FAULTS_BED_SERVICES`)."""
    bed = FaultBed.of(testbed)
    return Bed(
        job_dsn=bed.postgres_proxied.conninfo(),
        job_bootstrap=bed.kafka_proxied.bootstrap_servers,
        postgres_dsn=bed.postgres_direct.conninfo(),
        kafka=bed.kafka_direct,
        create_topic=lambda topic: create_topic(bed.kafka_direct, topic),
        open_kafka_transactions=bed.open_kafka_transactions,
        heal=bed.prepare,
        kinds=lambda target: fault_bed_kinds(target, bed),
    )


def replicated_bed(
    testbed: Testbed, topic: str, job_id: str, rng: random.Random, *, kafka: bool
) -> Bed:
    """The replicated servers (started: `REPLICATED_SERVICES`; held: `held`). The pair is
    made afresh in synchronous mode unless it is in that mode with a standby already (never
    while a job writes to it: this runs before the job starts)."""
    cluster, pair = testbed.kafka_cluster, testbed.postgres_standby
    if pair.state().mode != "sync" or pair.state().standby is None:
        pair.reset("sync")
    servers = Replicated(cluster, pair, topic, transactional_id(job_id, "kafka"), rng)

    def heal() -> None:
        cluster.up()  # any node left down starts again
        cluster.wait_healthy()
        pair.up()
        if pair.state().standby is None:
            pair.rebuild_standby()

    dsn = pair.endpoint().conninfo()  # both servers, target_session_attrs=read-write
    return Bed(
        job_dsn=dsn,
        job_bootstrap=cluster.endpoint().bootstrap_servers,
        postgres_dsn=dsn,
        kafka=cluster.endpoint(),
        create_topic=lambda topic: cluster.create_topic(topic, partitions=1),
        open_kafka_transactions=cluster.open_transactions,
        heal=heal,
        kinds=lambda target: replicated_kinds(target, servers, kafka=kafka),
    )
