"""Spark Connect servers from the pyspark wheel: a `local[2]` Spark driver that clients reach
over gRPC (`sc://127.0.0.1:<port>`), the way Databricks and Spark 4 clusters are reached.

The server is `spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`
run from the wheel's SPARK_HOME (the server jar ships in pyspark's `jars/`), detached in a
process group of its own, with its pid file, log and scratch folders in its service folder.
Server-side Python (foreachBatch functions, UDFs, Python data sources) runs this interpreter
(`PYSPARK_PYTHON`), so it imports the durable-sinks installed here; the extra jars of
`spark.py` (Spark's Kafka connector, the Postgres JDBC driver) are on `--jars`.

Two instances: `connect`, the main bed's, shared by every test and never stopped by one; and
`faults-connect`, on its own port and folder, which crash tests SIGKILL (`kill()`: a driver
host dying) and start again.

`up` waits for a real query: `range(1)` sent as a Spark Connect `ExecutePlan` over gRPC, with
pyspark's generated protocol classes, answered with one row. Not a `SparkSession` in this
process: `SparkSession.builder.remote(...).getOrCreate()` switches the whole Python process to
Connect mode (docs/testbed.md, "Spark Connect"), which would break the classic `spark` fixture
of the test that happened to start the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

from ._layout import Layout
from ._log4j import spark_log4j2
from ._maven import require_java
from ._process import (
    ServiceError,
    descendants,
    file_lock,
    port_accepts,
    process_group,
    require_free_ports,
    start_daemon,
    stop_group,
    wait_ports_released,
    wait_until,
)
from ._service import Daemon, remove_tree
from .spark import DEFAULT_CONF as SPARK_DEFAULT_CONF
from .spark import Spark, java_options

NAME = "connect"
#: The second instance, which tests may kill (`Testbed.faults_connect`).
FAULTS_NAME = "faults-connect"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: Seen: ~20 s alone on 2 cores; slower while other servers start beside it.
START_TIMEOUT = 180.0
#: The first query of a fresh JVM compiles a lot; later ones answer in well under a second.
PROBE_TIMEOUT = 60.0

#: spark.py's DEFAULT_CONF (small, predictable and kind to a 2-core, shared machine), but the
#: master, which spark-submit takes as `--master`.
DEFAULT_CONF = {k: v for k, v in SPARK_DEFAULT_CONF.items() if k != "spark.master"}
#: Spark logs every job at INFO (~100 lines for one `range(1)`): only warnings and errors, and
#: the server's start, reach the log. DS_CONNECT_LOG_LEVEL=info brings everything back.
_OWN_LOGGER = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: Client-side switches a test process may carry (a remote session sets some of them): none
#: of them is meant for the server.
_CLIENT_ENV = (
    "SPARK_REMOTE",
    "SPARK_CONNECT_MODE_ENABLED",
    "SPARK_LOCAL_REMOTE",
    "SPARK_API_MODE",
    "PYSPARK_SUBMIT_ARGS",
)


class SparkConnect(Daemon):
    """One Spark Connect server: `url` is where clients reach it.

    `conf` adds to (or overrides) DEFAULT_CONF and the listening address; `env` adds to the
    server's environment. Data, logs and the pid file live in `<root>/<name>/` (root:
    DS_CONNECT_DIR, else DS_SERVICES_DIR).
    """

    stop_timeout = 30.0

    def __init__(
        self,
        layout: Layout,
        name: str = NAME,
        port: int | None = None,
        *,
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.layout = layout
        self.port = layout.connect.port if port is None else port
        self.home = layout.connect_dir(name)
        self.log = self.home / "connect.log"
        #: Spark's event log folder: a file per start of the server (its application id).
        self.events = self.home / "events"
        self.pid_file = self.home / "connect.pid"
        #: What the running server was started with (interpreter, port, conf).
        self.state_file = self.home / "server.json"
        self.log_config = self.home / "log4j2.properties"
        self.conf = {
            **DEFAULT_CONF,
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{self.log_config}",
            "spark.sql.warehouse.dir": str(self.home / "warehouse"),
            # Spark's event log (one JSON line per job, stage and cache event, in `events/`):
            # tests read from it what the server did, e.g. that nothing was cached.
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": f"file:{self.events}",
            "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false",
            **(conf or {}),
            # Where it listens is the layout's business, never a test's.
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
        }
        self.conf.update(java_options(self.conf))
        self.env = dict(env or {})

    @property
    def url(self) -> str:
        """The Spark Connect URL clients use: `SparkSession.builder.remote(url)`."""
        return f"sc://127.0.0.1:{self.port}"

    # -- the Service protocol ---------------------------------------------------------------

    def up(self) -> None:
        # Two pytest-xdist workers may call up() at once: only one may start the JVM.
        _require_client(self.name)
        with self._exclusive():
            if self.pid() is None:
                self._start()
            else:
                self._require_same_interpreter()
            wait_until(
                self.name,
                self.ready,
                timeout=START_TIMEOUT,
                what=f"a query (range(1)) over Spark Connect at {self.url} to answer",
                log=self.log,
                alive=lambda: self.pid() is not None,
            )

    def down(self) -> None:
        """SIGTERM the server (Spark's shutdown hooks run), then SIGKILL what is left of it,
        PySpark's worker daemon included; returns once no process of it runs and its port is
        free."""
        pid = self.pid()
        if pid is not None:
            self._stop(pid, kill=False)
        self.pid_file.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL every process of the server at once (the JVM and its Python workers,
        whatever their process group): a driver host dying, no shutdown hook runs. Returns
        once they are gone and the port is free. A stopped server is left alone."""
        pid = self.pid()
        if pid is not None:
            self._stop(pid, kill=True)
        self.pid_file.unlink(missing_ok=True)

    def reset(self) -> None:
        self.down()
        remove_tree(self.home)

    # -- Daemon's hooks (status) ------------------------------------------------------------

    def ports(self) -> dict[str, int]:
        return {"grpc": self.port}

    def ready(self) -> bool:
        try:
            return port_accepts(self.port) and self._query_answers()
        except ImportError:  # no gRPC client here (`up` says how to install it)
            return False

    def describe(self) -> str:
        return f"{self.url} local[2], driver {self.conf['spark.driver.memory']}"

    def log_files(self) -> tuple[Path, ...]:
        return (self.log,)

    # -- the rest ---------------------------------------------------------------------------

    def _exclusive(self) -> contextlib.AbstractContextManager[None]:
        return file_lock(self.home / "up.lock")

    def argv(self) -> list[str]:
        """The command that starts the server (its conf in `--conf` flags)."""
        jars = ",".join(str(j) for j in Spark(self.layout).extra_jars())
        conf = [arg for key, value in self.conf.items() for arg in ("--conf", f"{key}={value}")]
        return [
            str(spark_home() / "bin" / "spark-submit"),
            "--class",
            SERVER_CLASS,
            "--master",
            SPARK_DEFAULT_CONF["spark.master"],
            "--name",
            f"durable-sinks-{self.name}",
            "--jars",
            jars,
            *conf,
            "spark-internal",
        ]

    def _start(self) -> None:
        require_java(self.name)
        require_free_ports(self.name, self.ports())
        argv = self.argv()
        env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ENV}
        env.update(
            SPARK_HOME=str(spark_home()),
            # foreachBatch functions, UDFs and Python data sources run server-side, in this
            # interpreter: they import the durable-sinks installed here, not whatever
            # `python3` is first on PATH.
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            SPARK_LOCAL_IP="127.0.0.1",
            # Scratch space (shuffle, jars fetched by the executor) in the service folder;
            # as `spark.local.dir` it would log a warning on every start.
            SPARK_LOCAL_DIRS=str(self.home / "tmp"),
        )
        env.update(self.env)
        (self.home / "tmp").mkdir(parents=True, exist_ok=True)
        self.events.mkdir(parents=True, exist_ok=True)
        level = os.environ.get("DS_CONNECT_LOG_LEVEL") or "warn"
        self.log_config.write_text(spark_log4j2(level, _OWN_LOGGER))
        pid = start_daemon(argv, log=self.log, pid_file=self.pid_file, env=env, cwd=self.home)
        self.state_file.write_text(
            json.dumps(
                {"pid": pid, "python": sys.executable, "prefix": sys.prefix, "argv": argv},
                indent=2,
            )
        )

    def _require_same_interpreter(self) -> None:
        """A running server imports, server-side, the durable-sinks of the interpreter that
        started it: another checkout's (a worktree sharing DS_SERVICES_DIR) would run code
        other than the one under test, silently. Refuse instead."""
        try:
            started: dict[str, object] = json.loads(self.state_file.read_text())
        except (FileNotFoundError, ValueError):
            return
        if started.get("prefix") not in (None, sys.prefix):
            raise ServiceError(
                self.name,
                f"the server at {self.url} (pid {self.pid()}) runs Python workers from "
                f"{started.get('python')}, not from this interpreter ({sys.executable}): its "
                "server-side code would import another checkout's durable-sinks. Stop it "
                f"(`python -m tests.services down {self.name}` from that checkout) or give "
                "this checkout Connect servers of its own: DS_CONNECT_DIR (a folder) and "
                "DS_CONNECT_PORT (docs/testbed.md).",
                log=self.log,
            )

    def _stop(self, pid: int, *, kill: bool) -> None:
        # PySpark's worker daemon puts itself in a process group of its own (its workers
        # follow it): find every group below the JVM before the JVM dies and they are
        # re-parented, then stop them all. Never our own group.
        own = os.getpgrp()
        groups = [pid]
        for child in descendants(pid):
            group = process_group(child)
            if group is not None and group not in groups and group != own:
                groups.append(group)
        if kill:
            for group in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
        for group in groups:
            stop_group(self.name, group, timeout=self.stop_timeout if group == pid else 10.0)
        wait_ports_released(self.name, self.ports())

    def _query_answers(self) -> bool:
        """Whether `range(1)`, sent as an ExecutePlan request, comes back as one row.

        pyspark's generated gRPC classes are Spark Connect's wire protocol, the stable part of
        it; the session id is new each time and released afterwards.
        """
        import grpc
        from pyspark.sql.connect.proto import base_pb2, base_pb2_grpc, relations_pb2

        session = str(uuid.uuid4())
        user = base_pb2.UserContext(user_id="durable-sinks-testbed")
        plan = base_pb2.Plan(
            root=relations_pb2.Relation(range=relations_pb2.Range(start=0, end=1, step=1))
        )
        rows = 0
        try:
            with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
                stub = base_pb2_grpc.SparkConnectServiceStub(channel)  # type: ignore[no-untyped-call]
                request = base_pb2.ExecutePlanRequest(
                    session_id=session, user_context=user, plan=plan
                )
                for response in stub.ExecutePlan(request, timeout=PROBE_TIMEOUT):
                    if response.HasField("arrow_batch"):
                        rows += response.arrow_batch.row_count
                if hasattr(stub, "ReleaseSession"):  # (Spark Connect 4.0 and later)
                    stub.ReleaseSession(
                        base_pb2.ReleaseSessionRequest(session_id=session, user_context=user),
                        timeout=PROBE_TIMEOUT,
                    )
        except grpc.RpcError:
            return False
        return rows == 1


def spark_home() -> Path:
    """The pyspark wheel's folder: a SPARK_HOME (bin/, jars/) of the installed version."""
    import pyspark

    return Path(pyspark.__file__).parent


def _require_client(service: str) -> None:
    """The gRPC client (`pyspark[connect]`) must be importable: `up` waits on a query."""
    try:
        import grpc  # noqa: F401
        import pyspark.sql.connect.proto  # noqa: F401
    except ImportError as exc:
        raise ServiceError(
            service,
            f"the Spark Connect client is not installed ({exc}): install the dev extras "
            "(`pip install -e '.[dev]'`, which bring durable-sinks[connect], i.e. "
            "pyspark[connect]: grpcio, grpcio-status, googleapis-common-protos, zstandard)",
        ) from None
