"""Where the test bed lives: folders, ports and versions, all overridable from the environment.

Every server listens on 127.0.0.1 only, on ports below Linux's ephemeral range (32768+) so an
outgoing connection can never have taken one. Each value can be overridden by an environment
variable (named beside it) so that a second test bed, or a machine where a port is taken, can
run side by side.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import overload

REPO_ROOT = Path(__file__).resolve().parents[2]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"{name}={raw!r} is not a port number; unset it or give an integer"
        ) from None


def _env_int_or_none(name: str) -> int | None:
    """An overriding port when the variable is set, else None (the default is derived)."""
    if not os.environ.get(name):
        return None
    return _env_int(name, 0)


@overload
def _env_path(name: str, default: Path) -> Path: ...


@overload
def _env_path(name: str, default: None) -> Path | None: ...


def _env_path(name: str, default: Path | None) -> Path | None:
    raw = os.environ.get(name)
    return Path(raw).expanduser().resolve() if raw else default


@dataclass(frozen=True)
class PostgresPorts:
    port: int = 15432  # DS_PG_PORT


@dataclass(frozen=True)
class PostgresStandbyPorts:
    """The Postgres primary and its streaming standby (service `postgres-standby`): ports
    of the two servers, which swap roles at a failover (`primary` is the port of the server
    that starts as primary).

    The default is the main bed's Postgres port + 20 (and + 21), so that a second test bed
    moved with DS_PG_PORT alone moves it too, and so that no private bed's Postgres (the
    shared bed's ports + 200 or + 400) takes it.
    """

    primary: int = 15452  # DS_PG_STANDBY_PORT
    standby: int = 15453  # DS_PG_STANDBY_PORT + 1
    #: Where an old primary runs alone after a failover (for a repair to read), outside the
    #: pair's connection string: DS_PG_STANDBY_PORT + 2.
    alone: int = 15454

    def shifted(self, offset: int) -> PostgresStandbyPorts:
        return PostgresStandbyPorts(
            self.primary + offset, self.standby + offset, self.alone + offset
        )


@dataclass(frozen=True)
class KafkaPorts:
    """`broker` is the client and inter-broker listener, advertised as itself.

    `external` (the faults bed's only) is a second client listener bound on that port but
    advertised as `external_advertised`, the Toxiproxy port that forwards to it: a client that
    bootstraps through the proxy is told to keep talking through the proxy, while the broker's
    own traffic (transaction markers) stays on `broker`, off the proxy.
    """

    broker: int = 19092  # DS_KAFKA_PORT
    controller: int = 19093  # DS_KAFKA_CONTROLLER_PORT
    external: int | None = None
    external_advertised: int | None = None
    #: The main bed's SASL_SSL listener (SCRAM-SHA-512, ACLs), advertised as `localhost`;
    #: DS_KAFKA_SECURE_PORT, by default the broker's port + 3.
    secure: int | None = None


@dataclass(frozen=True)
class KafkaClusterPorts:
    """The three-broker KRaft cluster (`kafka-cluster`): node i (1-3) listens for clients and
    its peers at `base` + 2(i - 1) and for the KRaft quorum one port above that, so the
    defaults are 19492-19497 (DS_KAFKA_CLUSTER_PORT moves them all): clear of the private
    beds' Kafka and faults bed (the shared bed's + 200: 19292-19396), which may run beside it."""

    base: int = 19492  # DS_KAFKA_CLUSTER_PORT
    nodes: int = 3

    def node(self, node_id: int) -> KafkaPorts:
        """Node `node_id`'s (1-based) broker and controller ports."""
        if not 1 <= node_id <= self.nodes:
            raise ValueError(f"node ids are 1-{self.nodes}, not {node_id}")
        broker = self.base + 2 * (node_id - 1)
        return KafkaPorts(broker=broker, controller=broker + 1)

    def all(self) -> dict[str, int]:
        """Every port the cluster listens on, by node and role."""
        ports: dict[str, int] = {}
        for node_id in range(1, self.nodes + 1):
            node = self.node(node_id)
            ports[f"node-{node_id}.broker"] = node.broker
            ports[f"node-{node_id}.controller"] = node.controller
        return ports


@dataclass(frozen=True)
class S3Ports:
    """SeaweedFS `weed mini` opens five servers, each with an HTTP and a gRPC port.

    The gRPC ports are HTTP + 10000: mini's embedded worker dials the admin server at that
    offset whatever `-admin.port.grpc` says, so every base port must stay below 55536.
    """

    s3: int = 18333  # DS_S3_PORT
    master: int = 19333  # DS_S3_MASTER_PORT
    volume: int = 18080  # DS_S3_VOLUME_PORT
    filer: int = 18888  # DS_S3_FILER_PORT
    admin: int = 13646  # DS_S3_ADMIN_PORT
    #: The S3 gateway's HTTPS port (the test bed's certificate); DS_S3_HTTPS_PORT, by default
    #: the S3 port + 1.
    https: int = 18334
    #: The Iceberg REST catalog (HTTP, no gRPC port); DS_S3_ICEBERG_PORT, by default the S3
    #: port + 2.
    iceberg: int = 18335

    def all(self) -> dict[str, int]:
        """Every port the server listens on, by role (`https` is the S3 gateway's second,
        `iceberg` its Iceberg REST catalog)."""
        ports: dict[str, int] = {}
        for role in ("s3", "master", "volume", "filer", "admin"):
            http = getattr(self, role)
            ports[role] = http
            ports[f"{role}.grpc"] = http + 10000
        ports["https"] = self.https
        ports["iceberg"] = self.iceberg
        return ports


@dataclass(frozen=True)
class MotoPorts:
    """moto's S3 server: a second, independent S3 implementation (one port, HTTP only).

    The default is the SeaweedFS S3 port + 100, so that a second test bed moved with
    DS_S3_PORT alone moves it too.
    """

    port: int = 18433  # DS_MOTO_PORT


@dataclass(frozen=True)
class FaultsPorts:
    """The fault-only test bed's Postgres and Kafka (tests restart and kill these).

    Defaults are the main bed's ports + 100 (the external Kafka listener + 102), each
    overridable on its own.
    """

    postgres: int = 15532  # DS_FAULTS_PG_PORT
    kafka: int = 19192  # DS_FAULTS_KAFKA_PORT (internal listener: inter-broker, direct)
    kafka_controller: int = 19193  # DS_FAULTS_KAFKA_CONTROLLER_PORT
    kafka_external: int = 19194  # DS_FAULTS_KAFKA_EXTERNAL_PORT (advertised as the proxy's)


@dataclass(frozen=True)
class ToxiproxyPorts:
    """Toxiproxy's API and the port each of its proxies listens on.

    Defaults are derived from the main bed's ports like the faults bed's (main Postgres + 110,
    main broker + 103 and + 104), so that a second test bed moved with the DS_PG_PORT and
    DS_KAFKA_* variables alone moves these too; S3's is the main bed's S3 port + 110.
    """

    api: int = 19196  # DS_TOXIPROXY_PORT
    postgres: int = 15542  # DS_TOXIPROXY_PG_PORT -> faults Postgres
    kafka: int = 19195  # DS_TOXIPROXY_KAFKA_PORT -> faults Kafka's external listener
    s3: int = 18443  # DS_TOXIPROXY_S3_PORT -> the main bed's S3 server (SeaweedFS)


@dataclass(frozen=True)
class ConnectPorts:
    """Spark Connect servers (gRPC, one port each).

    `port` is the main bed's, shared by every test; `killable` is a second server that tests
    may SIGKILL and restart (crash tests: a driver host dying), by default `port` + 1 so that a
    second test bed moved with DS_CONNECT_PORT alone moves it too.
    """

    port: int = 15602  # DS_CONNECT_PORT
    killable: int = 15603  # DS_FAULTS_CONNECT_PORT


@dataclass(frozen=True)
class SparkClusterPorts:
    """The Spark standalone cluster: a master and two workers, each with an RPC port and a
    web UI port (the master's serves the JSON that `up` and `status` read).

    Defaults follow Spark's own (7077 for the master) + 10000, and are derived from `master`
    so that a second test bed moved with DS_SPARK_MASTER_PORT alone moves them all: the
    workers' RPC ports at `master` + 1 and + 2, the master's web UI at + 3, the workers' web
    UIs at + 4 and + 5. Executors and drivers listen on ports the kernel picks.
    """

    master: int = 17077  # DS_SPARK_MASTER_PORT
    workers: tuple[int, ...] = (17078, 17079)  # DS_SPARK_WORKER_PORT (first; then + 1)
    master_webui: int = 17080  # DS_SPARK_MASTER_WEBUI_PORT
    worker_webuis: tuple[int, ...] = (17081, 17082)  # DS_SPARK_WORKER_WEBUI_PORT (first; + 1)

    @classmethod
    def from_master(
        cls,
        master: int,
        *,
        worker: int | None = None,
        master_webui: int | None = None,
        worker_webui: int | None = None,
        count: int = 2,
    ) -> SparkClusterPorts:
        first_worker = master + 1 if worker is None else worker
        first_webui = master + 4 if worker_webui is None else worker_webui
        return cls(
            master=master,
            workers=tuple(first_worker + i for i in range(count)),
            master_webui=master + 3 if master_webui is None else master_webui,
            worker_webuis=tuple(first_webui + i for i in range(count)),
        )

    def shifted(self, offset: int) -> SparkClusterPorts:
        return SparkClusterPorts(
            master=self.master + offset,
            workers=tuple(p + offset for p in self.workers),
            master_webui=self.master_webui + offset,
            worker_webuis=tuple(p + offset for p in self.worker_webuis),
        )

    def all(self) -> dict[str, int]:
        """Every port the cluster listens on, by role."""
        ports = {"master": self.master, "master.webui": self.master_webui}
        for i, (port, webui) in enumerate(zip(self.workers, self.worker_webuis, strict=True)):
            ports[f"worker-{i}"] = port
            ports[f"worker-{i}.webui"] = webui
        return ports


@dataclass(frozen=True)
class Layout:
    """Folders and ports of one test bed.

    `root` holds each server's data and logs (`.services/` in the checkout, git-ignored);
    `cache` holds what is slow to fetch and safe to share between checkouts (Maven-built
    classpaths), by default under the user's cache folder so a fresh clone reuses it.
    `connect_root`, when set, holds the Spark Connect servers' folders instead of `root`: a
    Connect server runs its checkout's durable-sinks server-side, so a checkout that shares
    another's Postgres and Kafka (DS_SERVICES_DIR) runs Connect servers of its own.
    """

    root: Path
    cache: Path
    postgres: PostgresPorts = field(default_factory=PostgresPorts)
    postgres_standby: PostgresStandbyPorts = field(default_factory=PostgresStandbyPorts)
    kafka: KafkaPorts = field(default_factory=KafkaPorts)
    s3: S3Ports = field(default_factory=S3Ports)
    moto: MotoPorts = field(default_factory=MotoPorts)
    faults: FaultsPorts = field(default_factory=FaultsPorts)
    toxiproxy: ToxiproxyPorts = field(default_factory=ToxiproxyPorts)
    connect: ConnectPorts = field(default_factory=ConnectPorts)
    connect_root: Path | None = None  # DS_CONNECT_DIR
    spark_cluster: SparkClusterPorts = field(default_factory=SparkClusterPorts)
    kafka_cluster: KafkaClusterPorts = field(default_factory=KafkaClusterPorts)

    @classmethod
    def from_env(cls) -> Layout:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        pg = _env_int("DS_PG_PORT", PostgresPorts.port)
        broker = _env_int("DS_KAFKA_PORT", KafkaPorts.broker)
        controller = _env_int("DS_KAFKA_CONTROLLER_PORT", KafkaPorts.controller)
        s3 = _env_int("DS_S3_PORT", S3Ports.s3)
        connect = _env_int("DS_CONNECT_PORT", ConnectPorts.port)
        standby = _env_int("DS_PG_STANDBY_PORT", pg + 20)
        faults = FaultsPorts(
            postgres=_env_int("DS_FAULTS_PG_PORT", pg + 100),
            kafka=_env_int("DS_FAULTS_KAFKA_PORT", broker + 100),
            kafka_controller=_env_int("DS_FAULTS_KAFKA_CONTROLLER_PORT", controller + 100),
            kafka_external=_env_int("DS_FAULTS_KAFKA_EXTERNAL_PORT", broker + 102),
        )
        return cls(
            root=_env_path("DS_SERVICES_DIR", REPO_ROOT / ".services"),
            cache=_env_path("DS_CACHE_DIR", Path(xdg) / "durable-sinks"),
            postgres=PostgresPorts(port=pg),
            postgres_standby=PostgresStandbyPorts(standby, standby + 1, standby + 2),
            kafka=KafkaPorts(
                broker=broker,
                controller=controller,
                secure=_env_int("DS_KAFKA_SECURE_PORT", broker + 3),
            ),
            s3=S3Ports(
                s3=s3,
                https=_env_int("DS_S3_HTTPS_PORT", s3 + 1),
                iceberg=_env_int("DS_S3_ICEBERG_PORT", s3 + 2),
                master=_env_int("DS_S3_MASTER_PORT", S3Ports.master),
                volume=_env_int("DS_S3_VOLUME_PORT", S3Ports.volume),
                filer=_env_int("DS_S3_FILER_PORT", S3Ports.filer),
                admin=_env_int("DS_S3_ADMIN_PORT", S3Ports.admin),
            ),
            moto=MotoPorts(port=_env_int("DS_MOTO_PORT", s3 + 100)),
            faults=faults,
            toxiproxy=ToxiproxyPorts(
                api=_env_int("DS_TOXIPROXY_PORT", broker + 104),
                postgres=_env_int("DS_TOXIPROXY_PG_PORT", pg + 110),
                kafka=_env_int("DS_TOXIPROXY_KAFKA_PORT", broker + 103),
                s3=_env_int("DS_TOXIPROXY_S3_PORT", s3 + 110),
            ),
            connect=ConnectPorts(
                port=connect, killable=_env_int("DS_FAULTS_CONNECT_PORT", connect + 1)
            ),
            connect_root=_env_path("DS_CONNECT_DIR", None),
            spark_cluster=SparkClusterPorts.from_master(
                _env_int("DS_SPARK_MASTER_PORT", SparkClusterPorts.master),
                worker=_env_int_or_none("DS_SPARK_WORKER_PORT"),
                master_webui=_env_int_or_none("DS_SPARK_MASTER_WEBUI_PORT"),
                worker_webui=_env_int_or_none("DS_SPARK_WORKER_WEBUI_PORT"),
            ),
            kafka_cluster=KafkaClusterPorts(
                base=_env_int("DS_KAFKA_CLUSTER_PORT", KafkaClusterPorts.base)
            ),
        )

    def shifted(self, offset: int, root: Path) -> Layout:
        """A layout of its own: every port + `offset`, data under `root`, the same cache. For
        tests that start, stop and restart servers of their own while every other test uses
        the shared ones."""
        s3, faults, proxies = self.s3, self.faults, self.toxiproxy
        return Layout(
            root=root,
            cache=self.cache,
            postgres=PostgresPorts(port=self.postgres.port + offset),
            postgres_standby=self.postgres_standby.shifted(offset),
            kafka=KafkaPorts(
                broker=self.kafka.broker + offset,
                controller=self.kafka.controller + offset,
                secure=None if self.kafka.secure is None else self.kafka.secure + offset,
            ),
            s3=S3Ports(
                s3=s3.s3 + offset,
                https=s3.https + offset,
                iceberg=s3.iceberg + offset,
                master=s3.master + offset,
                volume=s3.volume + offset,
                filer=s3.filer + offset,
                admin=s3.admin + offset,
            ),
            moto=MotoPorts(port=self.moto.port + offset),
            faults=FaultsPorts(
                postgres=faults.postgres + offset,
                kafka=faults.kafka + offset,
                kafka_controller=faults.kafka_controller + offset,
                kafka_external=faults.kafka_external + offset,
            ),
            toxiproxy=ToxiproxyPorts(
                api=proxies.api + offset,
                postgres=proxies.postgres + offset,
                kafka=proxies.kafka + offset,
                s3=proxies.s3 + offset,
            ),
            connect=ConnectPorts(
                port=self.connect.port + offset, killable=self.connect.killable + offset
            ),
            spark_cluster=self.spark_cluster.shifted(offset),
            kafka_cluster=KafkaClusterPorts(base=self.kafka_cluster.base + offset),
        )

    def ports(self) -> dict[str, int]:
        """Every port a server of this layout may listen on, by server and role."""
        kafka, faults, proxies = self.kafka, self.faults, self.toxiproxy
        ports = {
            "postgres": self.postgres.port,
            "postgres-standby.primary": self.postgres_standby.primary,
            "postgres-standby.standby": self.postgres_standby.standby,
            "postgres-standby.alone": self.postgres_standby.alone,
            "kafka.broker": kafka.broker,
            "kafka.controller": kafka.controller,
            **{f"s3.{role}": port for role, port in self.s3.all().items()},
            "moto": self.moto.port,
            "faults-postgres": faults.postgres,
            "faults-kafka.broker": faults.kafka,
            "faults-kafka.controller": faults.kafka_controller,
            "faults-kafka.external": faults.kafka_external,
            "toxiproxy.api": proxies.api,
            "toxiproxy.postgres": proxies.postgres,
            "toxiproxy.kafka": proxies.kafka,
            "toxiproxy.s3": proxies.s3,
            "connect": self.connect.port,
            "faults-connect": self.connect.killable,
            **{f"spark-cluster.{role}": p for role, p in self.spark_cluster.all().items()},
            **{f"kafka-cluster.{role}": p for role, p in self.kafka_cluster.all().items()},
        }
        if kafka.secure is not None:
            ports["kafka.secure"] = kafka.secure
        return ports

    def faults_layout(self) -> Layout:
        """The fault-only bed as a layout of its own: the same Postgres and Kafka classes run
        on its ports, with data and logs under `<root>/faults/`."""
        return replace(
            self,
            root=self.root / "faults",
            postgres=PostgresPorts(port=self.faults.postgres),
            kafka=KafkaPorts(
                broker=self.faults.kafka,
                controller=self.faults.kafka_controller,
                external=self.faults.kafka_external,
                external_advertised=self.toxiproxy.kafka,
            ),
        )

    def service_dir(self, name: str) -> Path:
        return self.root / name

    def connect_dir(self, name: str) -> Path:
        """A Spark Connect server's folder."""
        return (self.connect_root or self.root) / name

    def log_dir(self) -> Path:
        return self.root / "logs"
