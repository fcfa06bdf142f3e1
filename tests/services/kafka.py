"""Apache Kafka from Maven Central's jars: one KRaft node that is both broker and controller.

Internal topics (offsets, transaction state, share-group state) have replication factor 1 and
min ISR 1, or transactions hang on a single node. Automatic topic creation is off, so a test
that writes to a topic it never created fails instead of silently getting defaults.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ._layout import KafkaPorts, Layout
from ._maven import classpath, require_java
from ._process import (
    ServiceError,
    port_accepts,
    require_free_ports,
    run,
    start_daemon,
    stop_group,
    wait_ports_released,
    wait_until,
)
from ._service import Daemon, remove_tree
from .endpoints import KafkaEndpoint
from .tls import SERVER_NAME, TestbedTls

NAME = "kafka"
HEAP = "512m"
START_TIMEOUT = 120.0
# Read by tests (transaction.timeout.ms must not exceed it): keep in one place.
TRANSACTION_MAX_TIMEOUT_MS = 900_000
#: A topic of the broker's own that `wait_transactions_ready` commits a transaction to.
PROBE_TOPIC = "testbed-probe"
_TRANSACTIONS_JAVA = Path(__file__).resolve().parent / "java" / "KafkaTransactions.java"
#: Transaction states in which a transaction is still open (not yet completed or aborted).
#: The faults bed's broker is SIGKILLed and restarted: its controller still holds the dead
#: incarnation's registration and refuses the new one (DUPLICATE_BROKER_REGISTRATION) until the
#: old session times out, by default 9 s (restart to metadata ~12 s, measured). A shorter session
#: brings that to ~5 s; heartbeats every 500 ms keep a busy 2-core machine from fencing it.
#: It also looks for transactions open past their time-out every second (default 10 s), so a
#: test of a transaction the broker timed out stalls seconds, not tens of seconds.
FAULTS_SETTINGS = {
    "broker.session.timeout.ms": "4000",
    "broker.heartbeat.interval.ms": "500",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
}
OPEN_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})


def new_cluster_id() -> str:
    """A random KRaft cluster id (base64url of a UUID) that never starts with '-'.

    One id in 64 would otherwise begin with '-', and kafka-storage's argument parser takes it
    for an option ("argument --cluster-id/-t: expected one argument"); Kafka's own
    Uuid.randomUuid() draws again for the same reason.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass(frozen=True)
class KafkaTransaction:
    """One transactional id as the broker's transaction coordinator describes it."""

    transactional_id: str
    state: str  # Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort, Empty, ...
    producer_id: int
    producer_epoch: int
    coordinator_id: int
    start_time_ms: int | None  # when the open transaction began
    timeout_ms: int
    partitions: tuple[str, ...]  # "topic:partition" the open transaction has written to

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES


LOG4J2 = """\
status = warn
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = {logs}/server.log
appender.file.filePattern = {logs}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.coordinator.name = org.apache.kafka.coordinator
logger.coordinator.level = INFO
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


class Kafka(Daemon):
    """One KRaft node, broker and controller in one JVM. `name` tells the main bed's
    (`kafka`) from the faults bed's (`faults-kafka`) and a cluster's nodes in messages and
    `status`; folders and ports come from the layout unless given.

    A node of a cluster (tests/services/kafka_cluster.py) is given its `node_id`, its own
    `ports` and `home`, the quorum's `voters` (node id -> controller port), the `cluster_id`
    every node is formatted with, and `settings` over the single node's (replication factors,
    min ISR)."""

    stop_timeout = 60.0

    def __init__(
        self,
        layout: Layout,
        name: str = NAME,
        settings: Mapping[str, str] | None = None,
        *,
        ports: KafkaPorts | None = None,
        home: Path | None = None,
        node_id: int = 1,
        voters: Mapping[int, int] | None = None,
        cluster_id: Callable[[], str] = new_cluster_id,
        heap: str = HEAP,
    ) -> None:
        self.name = name
        self.layout = layout
        self.settings = dict(settings or {})  # over the defaults of _write_config
        self.node_ports = ports or layout.kafka
        self.node_id = node_id
        self.voters = dict(voters or {node_id: self.node_ports.controller})
        self.cluster_id = cluster_id
        self.heap = heap
        self.home = home or layout.service_dir(NAME)
        self.data = self.home / "data"
        self.logs = self.home / "logs"
        self.out = self.home / "kafka.out"
        self.pid_file = self.home / "kafka.pid"
        self.config = self.home / "server.properties"

    def ports(self) -> dict[str, int]:
        ports = {"broker": self.node_ports.broker, "controller": self.node_ports.controller}
        if self.node_ports.external is not None:
            ports["external"] = self.node_ports.external
        if self.node_ports.secure is not None:
            ports["secure"] = self.node_ports.secure
        return ports

    def endpoint(self) -> KafkaEndpoint:
        return KafkaEndpoint(f"127.0.0.1:{self.node_ports.broker}")

    def up(self) -> None:
        if self.pid() is not None:
            wait_until(
                self.name,
                self.ready,
                timeout=START_TIMEOUT,
                what="the running broker to answer metadata requests",
                log=self.out,
                alive=lambda: self.pid() is not None,
            )
            return
        require_free_ports(self.name, self.ports())
        require_java(self.name)
        lib = classpath(self.name, "kafka.xml", self.layout.cache)
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self._write_config()
        if not (self.data / "meta.properties").exists():
            remove_tree(self.data)
            cluster_id = self.cluster_id()
            run(
                self.name,
                [
                    "java",
                    "-Xmx256m",
                    f"-Dlog4j2.configurationFile={self.home}/log4j2.properties",
                    "-cp",
                    f"{lib}/*",
                    "kafka.tools.StorageTool",
                    "format",
                    f"--cluster-id={cluster_id}",
                    "-c",
                    str(self.config),
                ],
                timeout=120,
            )
        start_daemon(
            [
                "java",
                f"-Xms{self.heap}",
                f"-Xmx{self.heap}",
                "-XX:+UseG1GC",
                "-XX:MaxGCPauseMillis=20",
                "-Djava.awt.headless=true",
                f"-Dkafka.logs.dir={self.logs}",
                f"-Dlog4j2.configurationFile={self.home}/log4j2.properties",
                "-cp",
                f"{lib}/*",
                "kafka.Kafka",
                str(self.config),
            ],
            log=self.out,
            pid_file=self.pid_file,
            cwd=self.home,
        )
        wait_until(
            self.name,
            self.ready,
            timeout=START_TIMEOUT,
            what="the broker to answer metadata requests",
            log=self.logs / "server.log",
            alive=lambda: self.pid() is not None,
        )

    def ready(self) -> bool:
        """True when the broker answers a metadata request and lists itself (registered with
        the controller and not fenced)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        if not port_accepts(self.node_ports.broker):
            return False
        admin = AdminClient(
            {
                "bootstrap.servers": self.endpoint().bootstrap_servers,
                "socket.connection.setup.timeout.ms": 2000,
                "log.connection.close": False,
                "log_level": 0,
            }
        )
        try:
            metadata = admin.list_topics(timeout=3)
        except KafkaException:
            return False
        return self.node_id in metadata.brokers

    def describe(self) -> str:
        ports = self.node_ports
        text = f"node {self.node_id}, " if len(self.voters) > 1 else ""
        text += f"bootstrap {self.endpoint().bootstrap_servers}"
        if ports.secure is not None:
            text += f", SASL_SSL {SERVER_NAME}:{ports.secure}"
        if ports.external is not None:
            text += (
                f", external 127.0.0.1:{ports.external} "
                f"advertised as 127.0.0.1:{ports.external_advertised}"
            )
        return text

    # -- fault controls (the faults bed's broker only: others share the main one) ----------
    def kill(self) -> None:
        """SIGKILL the broker JVM: a crash, no controlled shutdown and no flush. Returns once
        the process is gone and its ports are free. A stopped broker is left alone."""
        pid = self.pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        stop_group(self.name, pid, timeout=10)
        wait_ports_released(self.name, self.ports())
        self.pid_file.unlink(missing_ok=True)

    def start(self, timeout: float = START_TIMEOUT) -> float:
        """Start the broker (after `kill` or `down`) and wait until transactions work again;
        return the seconds from this call until a probe transaction committed."""
        started = time.monotonic()
        self.up()
        self.wait_transactions_ready(timeout)
        return time.monotonic() - started

    def wait_transactions_ready(self, timeout: float = START_TIMEOUT) -> float:
        """Block until a transactional producer initialises, writes to `PROBE_TOPIC` and
        commits (the transaction coordinator has loaded its state log); return the seconds
        waited. Raise ServiceError after `timeout`."""
        from confluent_kafka import KafkaException, Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        started = time.monotonic()
        config: dict[str, str | int | float | bool] = {
            "bootstrap.servers": self.endpoint().bootstrap_servers,
            "log.connection.close": False,
            "log_level": 0,
        }
        last: Exception | None = None
        while time.monotonic() - started < timeout:
            try:
                admin = AdminClient(config)
                if PROBE_TOPIC not in admin.list_topics(timeout=5).topics:
                    futures = admin.create_topics([NewTopic(PROBE_TOPIC, 1)], request_timeout=10)
                    with contextlib.suppress(KafkaException):  # created meanwhile
                        futures[PROBE_TOPIC].result(timeout=15)
                producer = Producer(
                    {
                        **config,
                        "transactional.id": f"{PROBE_TOPIC}-{self.name}",
                        "transaction.timeout.ms": 10_000,
                    }
                )
                producer.init_transactions(10)
                producer.begin_transaction()
                producer.produce(PROBE_TOPIC, b"probe")
                producer.commit_transaction(10)
                return time.monotonic() - started
            except KafkaException as exc:
                last = exc
            time.sleep(0.2)
        raise ServiceError(
            self.name,
            f"transactions did not work within {timeout:.0f} s of asking; last error: {last}",
            log=self.logs / "server.log",
        )

    def transactions(self) -> list[KafkaTransaction]:
        """Every transactional id the broker knows, with its state (`open` for those still
        running), by the Admin API's ListTransactions + DescribeTransactions: a JVM run of
        java/KafkaTransactions.java on the broker's classpath (~2-3 s)."""
        out = self.admin_tool(_TRANSACTIONS_JAVA, self.endpoint().bootstrap_servers)
        found = []
        for line in out.splitlines():
            fields = line.split("\t")
            if len(fields) != 8:
                continue
            txn_id, state, pid, epoch, coordinator, start, txn_timeout, parts = fields
            found.append(
                KafkaTransaction(
                    transactional_id=txn_id,
                    state=state,
                    producer_id=int(pid),
                    producer_epoch=int(epoch),
                    coordinator_id=int(coordinator),
                    start_time_ms=int(start) if int(start) >= 0 else None,
                    timeout_ms=int(txn_timeout),
                    partitions=tuple(p for p in parts.split(",") if p),
                )
            )
        return sorted(found, key=lambda t: t.transactional_id)

    def admin_tool(self, source: Path, *args: str) -> str:
        """Run the single-file Java program `source` (an Admin API call confluent-kafka does
        not offer) on the broker's classpath and return its standard output (~2-3 s: a JVM
        compiling and running it)."""
        lib = classpath(self.name, "kafka.xml", self.layout.cache)
        return run(
            self.name,
            ["java", "-Xmx128m", "-Dlog4j2.level=ERROR", "-cp", f"{lib}/*", str(source), *args],
            timeout=120,
        )

    def open_transactions(self) -> list[KafkaTransaction]:
        """The transactions still open (neither committed nor aborted yet)."""
        return [t for t in self.transactions() if t.open]

    def log_files(self) -> tuple[Path, ...]:
        return (self.logs / "server.log", self.out)

    def secure_endpoint(
        self, user: str, password: str, *, host: str = SERVER_NAME
    ) -> KafkaEndpoint:
        """Client settings for the SASL_SSL listener as SCRAM user `user` (see `SECURE`)."""
        if self.node_ports.secure is None:
            raise ServiceError(self.name, "this broker has no SASL_SSL listener")
        tls = TestbedTls(self.layout.service_dir("tls"))
        return KafkaEndpoint(
            f"{host}:{self.node_ports.secure}",
            security={
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": user,
                "sasl.password": password,
                "ssl.ca.location": str(tls.ca),
            },
        )

    def _secure_settings(self) -> dict[str, str]:
        """The SASL_SSL listener: TLS with the test bed's certificate, SCRAM-SHA-512 users
        (made by tests through the admin API), and the StandardAuthorizer, so every SCRAM
        user may do only what ACLs allow. The PLAINTEXT and controller listeners' principal,
        ANONYMOUS, is a super user: every other test (and the broker itself) is unaffected."""
        tls = TestbedTls(self.layout.service_dir("tls")).ensure()
        prefix = "listener.name.sasl_ssl."
        return {
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            f"{prefix}scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            f"{prefix}ssl.keystore.type": "PEM",
            f"{prefix}ssl.keystore.location": str(tls.server_keystore),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
        }

    def _write_config(self) -> None:
        ports = self.node_ports
        broker = ports.broker
        listeners = [
            f"PLAINTEXT://127.0.0.1:{broker}",
            f"CONTROLLER://127.0.0.1:{ports.controller}",
        ]
        advertised = [f"PLAINTEXT://127.0.0.1:{broker}"]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        if ports.external is not None:
            # Bound on `external`, advertised as the proxy's port in front of it: see KafkaPorts.
            listeners.append(f"EXTERNAL://127.0.0.1:{ports.external}")
            advertised.append(f"EXTERNAL://127.0.0.1:{ports.external_advertised or ports.external}")
            protocols.append("EXTERNAL:PLAINTEXT")
        secure: dict[str, str] = {}
        if ports.secure is not None:
            listeners.append(f"SASL_SSL://127.0.0.1:{ports.secure}")
            advertised.append(f"SASL_SSL://{SERVER_NAME}:{ports.secure}")
            protocols.append("SASL_SSL:SASL_SSL")
            secure = self._secure_settings()
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": ",".join(
                f"{node}@127.0.0.1:{port}" for node, port in sorted(self.voters.items())
            ),
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(protocols),
            "log.dirs": str(self.data),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "10",
            "transaction.max.timeout.ms": str(TRANSACTION_MAX_TIMEOUT_MS),
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "log.retention.hours": "24",
            **secure,
            **self.settings,
        }
        self.config.write_text(
            "# Written by tests/services/kafka.py on every start.\n"
            + "".join(f"{key}={value}\n" for key, value in settings.items())
        )
        (self.home / "log4j2.properties").write_text(LOG4J2.format(logs=self.logs))
