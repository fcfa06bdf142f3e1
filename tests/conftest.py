"""Session-wide servers and per-test unique names.

Servers come up once per session, on first use (`python -m tests.services up` beforehand makes
that instant). A test that needs a server that cannot be started or reached errors with the
reason: nothing here skips. Tests that need no server (tests/unit) start none.

Isolation is by name: every test gets its own Postgres schema, Kafka topic names, S3 key prefix
and job id, so tests never see each other's data and need no clean-up to stay independent.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg import sql

from tests.services import (
    IcebergRestEndpoint,
    KafkaCluster,
    KafkaEndpoint,
    PostgresEndpoint,
    PostgresPair,
    S3Endpoint,
    SparkCluster,
    SparkConnect,
    Testbed,
    up,
)
from tests.services._process import file_lock, tests_lock
from tests.services.spark import JAVA_OPTIONS_ENV, SHORT_LIVED_JVM
from tests.support.connect_client import ConnectClient
from tests.support.fault_bed import FaultBed
from tests.support.kafka_access import KafkaAccess
from tests.support.pg_access import Role
from tests.support.s3_access import S3Access
from tests.support.targets import create_topic
from tests.support.tiers import TIER_MARKS, tier_included
from tests.support.timings import register as register_timings
from tests.support.xdist_groups import add_group_marks, mark_groups

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Spark drivers of this session and of the processes its tests start (tests/services/spark.py).
os.environ.setdefault(JAVA_OPTIONS_ENV, SHORT_LIVED_JVM)


class UniqueNames:
    """Names no other test (or earlier run) uses: `<prefix>_<test name>_<random>`."""

    def __init__(self, test_name: str) -> None:
        slug = re.sub(r"[^a-z0-9]+", "_", test_name.lower()).strip("_")
        self._stem = slug[:30]
        self.token = uuid.uuid4().hex[:10]

    def name(self, prefix: str) -> str:
        return f"{prefix}_{self._stem}_{self.token}"[:63]

    @property
    def job_id(self) -> str:
        return self.name("job")


@pytest.fixture(scope="session")
def testbed() -> Testbed:
    """The test bed's servers; each endpoint fixture below starts only the one it needs."""
    return Testbed.create()


@pytest.fixture(scope="session")
def postgres(testbed: Testbed) -> PostgresEndpoint:
    up(["postgres"], testbed)
    return testbed.postgres.endpoint()


@pytest.fixture(scope="session")
def kafka(testbed: Testbed) -> KafkaEndpoint:
    up(["kafka"], testbed)
    return testbed.kafka.endpoint()


@pytest.fixture(scope="session")
def s3(testbed: Testbed) -> S3Endpoint:
    up(["s3"], testbed)
    return testbed.s3.endpoint()


@pytest.fixture(scope="session")
def iceberg_rest(testbed: Testbed) -> IcebergRestEndpoint:
    """SeaweedFS's Iceberg REST catalog (the `s3` server's), its warehouse an S3 Tables
    bucket on the same gateway."""
    up(["s3"], testbed)
    return testbed.s3.catalog_endpoint()


@pytest.fixture(scope="session")
def moto_s3(testbed: Testbed) -> S3Endpoint:
    """moto's S3 server: a second S3 implementation, in memory (docs/testbed.md), with the
    same bucket name as `s3`; these credentials are allowed everything."""
    up(["moto"], testbed)
    return testbed.moto.endpoint()


@pytest.fixture(scope="session")
def spark(testbed: Testbed) -> Iterator[SparkSession]:
    up(["spark"], testbed)
    # Delta's reader (tests/spark/test_delta.py) needs its extension and catalog, which are
    # static settings: the shared session has them (other tables are left to Spark's own
    # catalog by DeltaCatalog). The compatibility lanes' pyspark has no Delta jars.
    delta = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.databricks.delta.snapshotPartitions": "2",
    }
    session = testbed.spark.session(
        "durable-sinks-tests", **(delta if testbed.spark.has_delta() else {})
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_connect(testbed: Testbed) -> str:
    """The main bed's Spark Connect server (shared: never stop or kill it); its `sc://` URL.
    Open sessions on it in a child process: `connect_client` (docs/testbed.md)."""
    up(["connect"], testbed)
    return testbed.connect.url


@pytest.fixture
def connect_client(spark_connect: str, tmp_path: Path) -> ConnectClient:
    """Runs `fn(spark, ...)` with a remote session on the main bed's Connect server, in a
    child process: `connect_client.run(fn, *args)` (tests/support/connect_client.py). The
    clients' logs stay in the test's tmp_path when they fail."""
    return ConnectClient(spark_connect, folder=tmp_path / "connect-clients")


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> UniqueNames:
    return UniqueNames(request.node.name)


@pytest.fixture
def job_id(unique: UniqueNames) -> str:
    return unique.job_id


@pytest.fixture
def conn(postgres: PostgresEndpoint) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit session on the test bed's Postgres, for the test's own checks."""
    with psycopg.connect(postgres.conninfo(), autocommit=True) as connection:
        yield connection


@pytest.fixture
def pg_schema(postgres: PostgresEndpoint, unique: UniqueNames) -> Iterator[str]:
    """A fresh schema of this test's own; dropped afterwards if nothing still holds it."""
    schema = unique.name("t")
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    yield schema
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        conn.execute("SET lock_timeout = '2s'")
        # A prepared transaction the test left behind holds the schema: the test's own
        # assertions about leftovers are what must catch that, not this clean-up.
        with contextlib.suppress(psycopg.errors.LockNotAvailable):
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def kafka_topic(kafka: KafkaEndpoint, unique: UniqueNames) -> Iterator[str]:
    """A new topic with one partition, deleted afterwards."""
    name = unique.name("topic")
    admin = AdminClient(kafka.config())
    create_topic(admin, name)  # (the broker answers CreateTopics before its metadata has it)
    yield name
    for future in admin.delete_topics([name], request_timeout=30).values():
        future.result(timeout=30)


@pytest.fixture
def s3_prefix(s3: S3Endpoint, unique: UniqueNames) -> str:
    """A key prefix of this test's own inside the test bed's bucket."""
    return unique.name("p") + "/"


@pytest.fixture
def s3_access(testbed: Testbed) -> Iterator[S3Access]:
    """Makes credentials limited to some S3 actions on a bucket, on SeaweedFS or moto:
    `s3_access.endpoint(deny=["s3:AbortMultipartUpload"])`,
    `s3_access.endpoint("moto", allow=READ_ONLY)` (tests/support/s3_access.py). The users
    are deleted after the test."""
    access = S3Access(testbed)
    yield access
    access.close()


# -- the secured servers (docs/security.md, tests/integration/test_security*.py) ----------------


@pytest.fixture
def kafka_access(testbed: Testbed) -> Iterator[KafkaAccess]:
    testbed.kafka.up()
    access = KafkaAccess(testbed)
    yield access
    access.close()


@pytest.fixture
def secure_topic(kafka_access: KafkaAccess, unique: UniqueNames) -> Iterator[str]:
    """A topic and its progress topic (compacted), made by the admin: the job's user may
    not create topics."""
    topic = unique.name("sec")
    admin = kafka_access.admin
    create_topic(admin, topic)
    create_topic(admin, f"{topic}-ds-progress", 1, **{"cleanup.policy": "compact"})
    yield topic
    for future in admin.delete_topics([topic, f"{topic}-ds-progress"]).values():
        future.result(timeout=30)


@pytest.fixture
def s3_https(testbed: Testbed) -> S3Endpoint:
    testbed.s3.up()
    return testbed.s3.https_endpoint()


@pytest.fixture
def events_table(postgres: PostgresEndpoint, pg_schema: str) -> str:
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, note text NOT NULL)").format(
                sql.Identifier(pg_schema, "events")
            )
        )
    return f"{pg_schema}.events"


@pytest.fixture
def roles(
    postgres: PostgresEndpoint, pg_schema: str, unique: UniqueNames
) -> Iterator[Callable[..., Role]]:
    made: list[Role] = []

    def make(*, create: bool = True) -> Role:
        role = Role(postgres, pg_schema, unique.name(f"r{len(made)}"), create=create)
        made.append(role)
        return role

    yield make
    for role in made:
        role.drop()


def pytest_configure(config: pytest.Config) -> None:
    """Each test's time is recorded where DS_TEST_TIMES names (the long tiers' runs,
    tests/long_tiers.py)."""
    register_timings(config)


# -- the faults bed: servers fault tests may restart, kill and cut (docs/testbed.md) ----------


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Iterator[None]:
    """Every test that holds a serial resource (the faults bed, the killable Connect server,
    the Spark cluster, the private beds' ports) joins that resource's `xdist_group`, so that
    `--dist loadgroup` runs them on one worker while the other runs the rest
    (tests/support/xdist_groups.py): marked before any other hook (xdist's worker reads the
    marks in its own), and the groups written into the node ids after all of them."""
    add_group_marks(items)
    # Each long tier's own tests (`fault_tier`, `crash_tier`, `compat_tier`, `replicated_tier`)
    # run where that tier's variable says so (tests/support/tiers.py): deselected here, not
    # skipped.
    for mark in TIER_MARKS:
        if tier_included(mark):
            continue
        dropped = [item for item in items if item.get_closest_marker(mark)]
        if dropped:
            items[:] = [item for item in items if not item.get_closest_marker(mark)]
            config.hook.pytest_deselected(items=dropped)
    yield
    mark_groups(config, items)


@pytest.fixture(scope="session")
def fault_testbed(testbed: Testbed) -> FaultBed:
    """The faults bed, started once per session. Tests take `fault_bed` instead."""
    bed = FaultBed.of(testbed)
    with bed.exclusive():  # two xdist workers starting it at once would race for its ports
        up(["faults"], testbed)
    return bed


@pytest.fixture
def fault_bed(fault_testbed: FaultBed) -> Iterator[FaultBed]:
    """The faults bed for this test alone (other xdist workers' fault tests wait), running,
    every proxy enabled and no toxic; toxics are removed again afterwards."""
    with fault_testbed.exclusive():
        fault_testbed.prepare()
        yield fault_testbed
        fault_testbed.toxiproxy.reset()


@pytest.fixture
def fault_pg_schema(fault_bed: FaultBed, unique: UniqueNames) -> Iterator[str]:
    """A fresh schema of this test's own in the faults Postgres (made and dropped directly)."""
    schema = unique.name("t")
    with psycopg.connect(fault_bed.postgres_direct.conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    yield schema
    fault_bed.prepare()  # the test may have left the server stopped
    with psycopg.connect(fault_bed.postgres_direct.conninfo(), autocommit=True) as conn:
        conn.execute("SET lock_timeout = '2s'")
        with contextlib.suppress(psycopg.errors.LockNotAvailable):
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def fault_kafka_topic(fault_bed: FaultBed, unique: UniqueNames) -> Iterator[str]:
    """A new one-partition topic on the faults broker (made and deleted directly)."""
    name = unique.name("topic")
    admin = AdminClient(fault_bed.kafka_direct.config())
    create_topic(admin, name)  # (the broker answers CreateTopics before its metadata has it)
    yield name
    fault_bed.prepare()  # the test may have left the broker killed
    for future in admin.delete_topics([name], request_timeout=30).values():
        future.result(timeout=30)


# -- a Spark Connect server tests may kill (docs/testbed.md) ----------------------------------


@pytest.fixture
def private_ports(testbed: Testbed) -> Iterator[None]:
    """Held by every test that starts servers on the private beds' ports (the shared bed's +
    200, tests/testbed/test_lifecycle.py): one such test at a time across xdist workers, or
    one test's private Postgres is another's "taken port" or "unreachable server"."""
    with file_lock(testbed.layout.root / "private-ports.lock"):
        yield


#: The servers started on demand that tests break on purpose (each behind its tests' lock).
OnDemand = TypeVar("OnDemand", SparkConnect, KafkaCluster, SparkCluster, PostgresPair)


def started_once(server: OnDemand, testbed: Testbed) -> OnDemand:
    """`server` started for the session under its tests' lock: without the lock a session
    starting on one xdist worker could start it again while another worker's test has it
    killed (xdist groups do not form under pytest 9.2)."""
    with tests_lock(server):
        up([server.name], testbed)
    return server


@pytest.fixture(scope="session")
def killable_connect_server(testbed: Testbed) -> SparkConnect:
    """The killable Spark Connect server, started once per session. Tests take
    `killable_connect` instead."""
    return started_once(testbed.faults_connect, testbed)


@pytest.fixture
def killable_connect(killable_connect_server: SparkConnect) -> Iterator[SparkConnect]:
    """A Spark Connect server of its own port and folder (`faults-connect`), held by this test
    alone (other xdist workers' tests of it wait) and running when the test starts: one a
    previous test left killed or stopped is started again. The test may `kill()` it (SIGKILL
    of the JVM and its Python workers: a driver host dying), `down()` it and `up()` it again;
    `url` is where clients reach it (`ConnectClient(server.url)`)."""
    server = killable_connect_server
    with tests_lock(server):
        server.up()
        yield server


# -- a three-broker Kafka cluster whose nodes tests may kill (docs/testbed.md) ---------------


@pytest.fixture(scope="session")
def kafka_cluster_server(testbed: Testbed) -> KafkaCluster:
    """The three-broker Kafka cluster, started once per session, under the tests' lock.
    Tests take `kafka_cluster` instead."""
    return started_once(testbed.kafka_cluster, testbed)


@pytest.fixture
def kafka_cluster(kafka_cluster_server: KafkaCluster) -> Iterator[KafkaCluster]:
    """The three-broker Kafka cluster for this test alone (other xdist workers' tests of it
    wait), every node running and every partition's ISR full when the test starts: a node a
    previous test left killed or stopped is started again. The test may `kill(node)`,
    `stop(node)`, `start(node)` and `rolling_restart()`; clients reach it at `endpoint()`."""
    cluster = kafka_cluster_server
    with tests_lock(cluster):
        cluster.up()
        yield cluster


@pytest.fixture
def cluster_topic(kafka_cluster: KafkaCluster, unique: UniqueNames) -> Iterator[str]:
    """A new topic of three partitions, three replicas, on the Kafka cluster (deleted
    afterwards, once every node runs again)."""
    name = unique.name("topic")
    kafka_cluster.create_topic(name, partitions=3)
    yield name
    kafka_cluster.up()
    admin = AdminClient(kafka_cluster.endpoint().config())
    for future in admin.delete_topics([name], request_timeout=30).values():
        future.result(timeout=30)


# -- a Spark standalone cluster whose executors and workers tests may kill (docs/testbed.md) --


@pytest.fixture(scope="session")
def spark_cluster_server(testbed: Testbed) -> SparkCluster:
    """The Spark standalone cluster (a master and two workers), started once per session,
    under the tests' lock. Tests take `spark_cluster` instead."""
    return started_once(testbed.spark_cluster, testbed)


@pytest.fixture
def spark_cluster(spark_cluster_server: SparkCluster) -> Iterator[SparkCluster]:
    """The Spark standalone cluster for this test alone (other xdist workers' tests of it
    wait), with both workers ALIVE when the test starts: a worker a previous test killed is
    started again. Drivers run in child processes with `driver_conf()` and `driver_env()`;
    the test may kill executors (`kill_executor`) and workers (`kill_worker`,
    `start_worker`). A test must stop its drivers: an application still running holds the
    cluster's cores, so it fails the next test's start here, named."""
    cluster = spark_cluster_server
    with tests_lock(cluster):
        cluster.up()
        cluster.wait_idle()
        yield cluster


# -- a Postgres primary with a streaming standby, for failover tests (docs/testbed.md) ---------


@pytest.fixture(scope="session")
def postgres_standby_server(testbed: Testbed) -> PostgresPair:
    """The primary and standby, started once per session under the tests' lock. Tests take
    `postgres_standby` instead."""
    return started_once(testbed.postgres_standby, testbed)


@pytest.fixture
def postgres_standby(postgres_standby_server: PostgresPair) -> Iterator[PostgresPair]:
    """The primary and standby for this test alone (other xdist workers' tests of it wait).
    The test calls `reset("sync")` or `reset("async")` first (a fresh pair in that mode, a new
    password: take endpoints after it), then may kill, promote and fail over
    (tests/services/postgres_standby.py)."""
    pair = postgres_standby_server
    with tests_lock(pair):
        yield pair


@pytest.fixture
def plugin_dists(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Installs the test distributions of tests/support/plugin_sink (a working sink kind and
    broken entry points) for this test: their `*.dist-info` folders go on `sys.path`, where
    `importlib.metadata` finds them as it finds any installed distribution."""
    from tests.support.plugin_sink import DISTS

    monkeypatch.syspath_prepend(str(DISTS))
    return DISTS
