"""The test bed: real Postgres, Kafka, S3 (SeaweedFS, and moto's server as a second S3
implementation), Spark and a Spark Connect server on 127.0.0.1, started by the project itself,
plus the faults bed: a second Postgres and Kafka that fault tests may restart and kill, behind
Toxiproxy, a second Spark Connect server that crash tests may kill, and a Spark standalone
cluster (a master and two workers) whose executors and workers tests may kill; and `compat`,
the compatibility lanes' virtualenvs (the oldest and newest supported pyspark and Python,
tests/services/compat.py), which `make test-compat` runs the Spark tests in; and
`iceberg-spark`, a pyspark 4.1 interpreter with Spark's Iceberg jars
(tests/services/iceberg_spark.py), in which Spark reads the Iceberg sink's tables; and
`postgres-standby`, a Postgres primary with a streaming standby that failover tests kill and
promote (tests/services/postgres_standby.py).

    python -m tests.services up [NAME ...]     start (idempotent), wait until each answers
    python -m tests.services status            what runs, where, pids, logs
    python -m tests.services down [NAME ...]   stop; no process is left behind
    python -m tests.services reset [NAME ...]  stop and delete the servers' data
    python -m tests.services logs NAME         where a server logs, and its last lines

NAME is one of NAMES, or `faults` for the faults bed (faults-postgres, faults-kafka and
toxiproxy). Without NAME, `up` starts DEFAULT_UP (everything but `faults-connect`,
`spark-cluster` and `kafka-cluster`, which only their fixtures start); `down`, `status` and
`reset` cover every name. The pytest fixtures in tests/conftest.py call `up()` once per session
for the server they need.
docs/testbed.md describes ports, folders and versions.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ._layout import Layout
from ._process import ServiceError, file_lock
from ._service import Service, Status
from ._steps import SetupStepError, describe
from .compat import CompatLanes
from .connect import FAULTS_NAME as CONNECT_FAULTS_NAME
from .connect import SparkConnect
from .endpoints import IcebergRestEndpoint, KafkaEndpoint, PostgresEndpoint, S3Endpoint
from .iceberg_spark import IcebergSpark
from .kafka import FAULTS_SETTINGS as KAFKA_FAULTS_SETTINGS
from .kafka import Kafka, KafkaTransaction
from .kafka_cluster import KafkaCluster
from .moto import Moto
from .postgres import Postgres, PreparedTransaction
from .postgres_standby import PostgresPair
from .s3 import S3
from .spark import Spark
from .spark_cluster import SparkCluster
from .toxiproxy import Toxiproxy

__all__ = [
    "DEFAULT_UP",
    "NAMES",
    "S3",
    "CompatLanes",
    "IcebergRestEndpoint",
    "IcebergSpark",
    "Kafka",
    "KafkaCluster",
    "KafkaEndpoint",
    "KafkaTransaction",
    "Layout",
    "Moto",
    "Postgres",
    "PostgresEndpoint",
    "PostgresPair",
    "PreparedTransaction",
    "S3Endpoint",
    "ServiceError",
    "SetupStepError",
    "Spark",
    "SparkCluster",
    "SparkConnect",
    "Testbed",
    "Toxiproxy",
    "down",
    "status",
    "up",
]

NAMES = (
    "postgres",
    "kafka",
    "s3",
    "moto",
    "spark",
    "connect",
    "faults-postgres",
    "faults-kafka",
    "toxiproxy",
    "faults-connect",
    "spark-cluster",
    "compat",
    "iceberg-spark",
    "postgres-standby",
    "kafka-cluster",
)
#: Names that stand for several servers.
GROUPS = {"faults": ("faults-postgres", "faults-kafka", "toxiproxy")}
#: Started only when their fixtures (or `up NAME`) ask for them: `faults-connect` (a second
#: Spark JVM of ~1 GB, ~20 s to start, for the few crash tests that kill it) and
#: `spark-cluster` (three JVMs of ~230 MB, ~11 s, for executor-loss tests), `postgres-standby`
#: (a primary and a streaming standby, for failover tests) and `kafka-cluster` (three Kafka
#: JVMs of ~330 MB, ~10 s, for the replicated servers' tests). `down`, `status` and `reset`
#: without names still cover them.
ON_DEMAND = ("faults-connect", "spark-cluster", "postgres-standby", "kafka-cluster")
#: What `up` without names starts.
DEFAULT_UP = tuple(name for name in NAMES if name not in ON_DEMAND)


@dataclass(frozen=True)
class Testbed:
    """All servers of one layout.

    The faults bed's Postgres and Kafka are the same classes as the main bed's, on the
    layout's `faults_layout()` (own folders under `<root>/faults/`, own ports); tests may stop,
    crash and kill those, never the main bed's, which every test shares. Likewise
    `faults_connect`, a second Spark Connect server on its own port and folder, is the one
    tests may kill; `connect` is shared. `spark_cluster` is a Spark standalone master and two
    workers; tests may kill its executors and workers (through its fixture, one test at a
    time).
    """

    __test__ = False  # not a pytest test class despite its name

    layout: Layout
    postgres: Postgres
    kafka: Kafka
    s3: S3
    moto: Moto
    spark: Spark
    connect: SparkConnect
    faults_postgres: Postgres
    faults_kafka: Kafka
    toxiproxy: Toxiproxy
    faults_connect: SparkConnect
    spark_cluster: SparkCluster
    compat: CompatLanes
    iceberg_spark: IcebergSpark
    postgres_standby: PostgresPair
    kafka_cluster: KafkaCluster

    @classmethod
    def create(cls, layout: Layout | None = None) -> Testbed:
        layout = layout or Layout.from_env()
        faults = layout.faults_layout()
        return cls(
            layout,
            Postgres(layout),
            Kafka(layout),
            S3(layout),
            Moto(layout),
            Spark(layout),
            SparkConnect(layout),
            Postgres(faults, name="faults-postgres"),
            Kafka(faults, name="faults-kafka", settings=KAFKA_FAULTS_SETTINGS),
            Toxiproxy(layout),
            SparkConnect(layout, name=CONNECT_FAULTS_NAME, port=layout.connect.killable),
            SparkCluster(layout),
            CompatLanes(layout),
            IcebergSpark(layout),
            PostgresPair(layout),
            KafkaCluster(layout),
        )

    def select(
        self, names: Iterable[str] | None = None, default: Iterable[str] = NAMES
    ) -> list[Service]:
        """The services `names` stand for, in order; `default` when no name is given."""
        chosen: list[str] = []
        for name in list(names) if names else list(default):
            for member in GROUPS.get(name, (name,)):
                if member not in chosen:
                    chosen.append(member)
        unknown = [n for n in chosen if n not in NAMES]
        if unknown:
            raise ValueError(
                f"unknown service {unknown}; choose from {', '.join([*NAMES, *GROUPS])}"
            )
        services: list[Service] = [getattr(self, name.replace("-", "_")) for name in chosen]
        return services


def _each(services: list[Service], action: str, layout: Layout) -> None:
    """Run `action` on every service concurrently, each under its service's lock (two
    processes, say two pytest-xdist workers on a fresh machine, must not both start one
    server); raise one error naming every failure and its cause."""
    _import_pyspark_once()

    def act(service: Service) -> None:
        with file_lock(layout.root / ".locks" / f"{service.name}.lock"):
            getattr(service, action)()

    with ThreadPoolExecutor(max_workers=len(services) or 1) as pool:
        futures = {s.name: pool.submit(act, s) for s in services}
    failures = []
    for name, future in futures.items():
        exc = future.exception()
        if exc is not None:
            failures.append(exc if isinstance(exc, ServiceError) else _unexpected(name, exc))
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise ServiceError(
            "testbed",
            f"{len(failures)} servers failed to {action}:\n\n"
            + "\n\n".join(str(f) for f in failures),
        )


def _unexpected(name: str, exc: BaseException) -> ServiceError:
    """An error no set-up code turned into a ServiceError: its type, message (an OSError's
    names its file) and where it was raised."""
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    place = f" (at {where[0].filename}:{where[0].lineno}, in {where[0].name})" if where else ""
    return ServiceError(name, describe(exc) + place)


def _import_pyspark_once() -> None:
    """Import pyspark.sql here, in one thread, before the services' threads do: two threads
    importing its circular package at once (the Spark and Spark Connect services) can see it
    partially initialised ("cannot import name 'SQLContext' from partially initialized
    module 'pyspark.sql'"), seen once on a fresh clone."""
    with contextlib.suppress(ImportError):
        import pyspark.sql  # noqa: F401


def up(names: Iterable[str] | None = None, testbed: Testbed | None = None) -> Testbed:
    """Start the chosen servers (DEFAULT_UP by default) and wait until each answers."""
    testbed = testbed or Testbed.create()
    _each(testbed.select(names, DEFAULT_UP), "up", testbed.layout)
    return testbed


def down(names: Iterable[str] | None = None, testbed: Testbed | None = None) -> None:
    """Stop the chosen servers; no process of theirs is left running."""
    testbed = testbed or Testbed.create()
    _each(testbed.select(names), "down", testbed.layout)


def status(testbed: Testbed | None = None) -> list[Status]:
    testbed = testbed or Testbed.create()
    return [s.status() for s in testbed.select()]
