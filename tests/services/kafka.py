"""Apache Kafka from Maven Central's jars: one KRaft node that is both broker and controller.

Internal topics (offsets, transaction state, share-group state) have replication factor 1 and
min ISR 1, or transactions hang on a single node. Automatic topic creation is off, so a test
that writes to a topic it never created fails instead of silently getting defaults.
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

from ._layout import Layout
from ._maven import classpath, require_java
from ._process import (
    port_accepts,
    require_free_ports,
    run,
    start_daemon,
    wait_until,
)
from ._service import Daemon, remove_tree
from .endpoints import KafkaEndpoint

NAME = "kafka"
HEAP = "512m"
START_TIMEOUT = 120.0
# Read by tests (transaction.timeout.ms must not exceed it): keep in one place.
TRANSACTION_MAX_TIMEOUT_MS = 900_000

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
    name = NAME
    stop_timeout = 60.0

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.home = layout.service_dir(NAME)
        self.data = self.home / "data"
        self.logs = self.home / "logs"
        self.out = self.home / "kafka.out"
        self.pid_file = self.home / "kafka.pid"
        self.config = self.home / "server.properties"

    def ports(self) -> dict[str, int]:
        return {"broker": self.layout.kafka.broker, "controller": self.layout.kafka.controller}

    def endpoint(self) -> KafkaEndpoint:
        return KafkaEndpoint(f"127.0.0.1:{self.layout.kafka.broker}")

    def up(self) -> None:
        if self.pid() is not None:
            wait_until(
                NAME,
                self.ready,
                timeout=START_TIMEOUT,
                what="the running broker to answer metadata requests",
                log=self.out,
                alive=lambda: self.pid() is not None,
            )
            return
        require_free_ports(NAME, self.ports())
        require_java(NAME)
        lib = classpath(NAME, "kafka.xml", self.layout.cache)
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self._write_config()
        if not (self.data / "meta.properties").exists():
            remove_tree(self.data)
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            run(
                NAME,
                [
                    "java",
                    "-Xmx256m",
                    f"-Dlog4j2.configurationFile={self.home}/log4j2.properties",
                    "-cp",
                    f"{lib}/*",
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(self.config),
                ],
                timeout=120,
            )
        start_daemon(
            [
                "java",
                f"-Xms{HEAP}",
                f"-Xmx{HEAP}",
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
            NAME,
            self.ready,
            timeout=START_TIMEOUT,
            what="the broker to answer metadata requests",
            log=self.logs / "server.log",
            alive=lambda: self.pid() is not None,
        )

    def ready(self) -> bool:
        """True when the broker answers a metadata request and lists itself."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        if not port_accepts(self.layout.kafka.broker):
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
        return len(metadata.brokers) == 1

    def describe(self) -> str:
        return f"bootstrap {self.endpoint().bootstrap_servers}"

    def log_files(self) -> tuple[Path, ...]:
        return (self.logs / "server.log", self.out)

    def _write_config(self) -> None:
        broker, controller = self.layout.kafka.broker, self.layout.kafka.controller
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller}",
            "listeners": f"PLAINTEXT://127.0.0.1:{broker},CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{broker}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
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
        }
        self.config.write_text(
            "# Written by tests/services/kafka.py on every start.\n"
            + "".join(f"{key}={value}\n" for key, value in settings.items())
        )
        (self.home / "log4j2.properties").write_text(LOG4J2.format(logs=self.logs))
