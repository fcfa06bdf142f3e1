"""A Spark standalone cluster from the pyspark wheel: Spark's own master and two workers, each a
JVM of its own, on 127.0.0.1. Drivers run elsewhere (a test's child process) and reach it at
`master_url` with `driver_conf()`; their executors are JVMs the workers start, with Python
workers of their own: the way a real cluster runs a PySpark job, where executors are other
processes that can die while the driver lives.

Each daemon is `<pyspark>/bin/spark-class org.apache.spark.deploy.master.Master` (or `.Worker`)
run from the wheel's SPARK_HOME, detached in a process group of its own, with its pid file and
log in the service folder. Each worker has 1 core and 1 GB for executors and its own work
folder (`work-<i>/<app id>/<executor id>/`: an executor's stdout, stderr and fetched jars);
executors get 512 MB each and an application at most 2 cores, so one executor per worker.

`up` returns once the master's JSON (`http://127.0.0.1:<web UI>/json/`) lists both workers
ALIVE. It is not part of `up` without names: only its fixture (tests/conftest.py) or
`python -m tests.services up spark-cluster` starts it.

Executor-loss tests use `executors()`, `kill_executor(pid)` (an executor lost: its worker
starts a replacement for the application), `kill_worker(i)` (a host lost) and `start_worker(i)`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Any

from ._layout import REPO_ROOT, Layout
from ._log4j import spark_log4j2
from ._maven import require_java
from ._process import (
    ServiceError,
    descendants,
    file_lock,
    pid_alive,
    process_group,
    read_pid,
    require_free_ports,
    start_daemon,
    stop_group,
    wait_ports_released,
    wait_until,
)
from ._service import Status, remove_tree
from .spark import DEFAULT_CONF as SPARK_DEFAULT_CONF
from .spark import Spark

NAME = "spark-cluster"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
#: What each worker offers executors, and what each daemon's own JVM may use.
WORKER_CORES = 1
WORKER_MEMORY = "1g"
DAEMON_MEMORY = "256m"
#: Seen: the master answers in ~3 s, workers register ~3 s later; slower under load.
START_TIMEOUT = 120.0
#: What a driver asks of the cluster: one 512 MB executor of 1 core per worker.
EXECUTOR_CONF = {
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
}
#: spark.py's DEFAULT_CONF (small, predictable), but the master, which is the cluster's.
DEFAULT_CONF = {k: v for k, v in SPARK_DEFAULT_CONF.items() if k != "spark.master"}

#: The daemons' settings (`--properties-file`). No REST submission server (another port);
#: finished applications' work folders are deleted after an hour (each holds its executors'
#: logs and a copy of the extra jars).
_DAEMON_CONF = {
    "spark.master.rest.enabled": "false",
    "spark.worker.cleanup.enabled": "true",
    "spark.worker.cleanup.interval": "600",
    "spark.worker.cleanup.appDataTtl": "3600",
}
#: Master and workers log their own events (workers registering, applications, executors
#: launched and lost) at INFO, everything else at WARN. DS_SPARK_CLUSTER_LOG_LEVEL=info
#: brings everything back.
_OWN_LOGGER = "org.apache.spark.deploy"


class SparkCluster:
    """A Spark standalone master and its workers (module docstring); `master_url` is where
    drivers reach it. Pid files, logs and work folders live in `<root>/<name>/`."""

    def __init__(self, layout: Layout, name: str = NAME) -> None:
        self.name = name
        self.layout = layout
        self.ports = layout.spark_cluster
        self.home = layout.service_dir(name)
        self.master_log = self.home / "master.log"
        self.master_pid_file = self.home / "master.pid"
        self.log_config = self.home / "log4j2.properties"
        self.daemon_conf = self.home / "daemon.conf"
        #: Who started the running cluster, from which SPARK_HOME (`_require_same_spark`).
        self.state_file = self.home / "cluster.json"

    @property
    def workers(self) -> int:
        """How many workers the cluster has."""
        return len(self.ports.workers)

    @property
    def master_url(self) -> str:
        """`spark.master` of a driver that runs on this cluster."""
        return f"spark://127.0.0.1:{self.ports.master}"

    @property
    def webui_url(self) -> str:
        """The master's web UI; its JSON (workers, applications) is at `<webui_url>/json/`."""
        return f"http://127.0.0.1:{self.ports.master_webui}"

    def worker_log(self, i: int) -> Path:
        return self.home / f"worker-{i}.log"

    def worker_pid_file(self, i: int) -> Path:
        return self.home / f"worker-{i}.pid"

    def work_dir(self, i: int) -> Path:
        """Worker i's work folder: `<app id>/<executor id>/` holds each executor's stdout,
        stderr and fetched jars."""
        return self.home / f"work-{i}"

    # -- the Service protocol ---------------------------------------------------------------

    def up(self) -> None:
        """Start the master and whatever worker is not running (two processes calling `up`
        at once are serialized); return when the master lists every worker ALIVE."""
        with self._exclusive():
            if self.master_pid() is None:
                # Workers of a master that is gone would re-register only after a back-off:
                # start everything afresh.
                for i in range(self.workers):
                    self._stop_worker(i, kill=False)
                self._start_master()
            else:
                self._require_same_spark()
            wait_until(
                self.name,
                lambda: self.master_state() is not None,
                timeout=START_TIMEOUT,
                what=f"the master's JSON at {self.webui_url}/json/ to answer",
                log=self.master_log,
                alive=lambda: self.master_pid() is not None,
            )
            for i in range(self.workers):
                if self.worker_pid(i) is None:
                    self._start_worker(i)
            for i in range(self.workers):
                self._wait_alive(i)

    def down(self) -> None:
        """Stop the master, then the workers (and their executors, Python workers included);
        returns once none of their processes runs and their ports are free.

        The master first: while it lives, a worker shutting down with an application running
        sees its executor end and is asked by the master, again and again, to launch a
        replacement, which fails ("Shutdown hooks cannot be modified during shutdown"), and
        its SIGTERM then took the whole 30 s before the SIGKILL (seen)."""
        pid = self.master_pid()
        if pid is not None:
            stop_group(self.name, pid, timeout=30.0)
        self.master_pid_file.unlink(missing_ok=True)
        for i in range(self.workers):
            self._stop_worker(i, kill=False)
        wait_ports_released(self.name, self.ports.all())

    def reset(self) -> None:
        self.down()
        remove_tree(self.home)

    def status(self) -> Status:
        pid = self.master_pid()
        detail = f"{self.master_url} (web UI {self.webui_url})"
        if pid is not None:
            state = self.master_state()
            if state is None:
                detail += " (NOT answering)"
            else:
                alive = set(self.workers_alive(state))
                workers = ", ".join(
                    f"{i}: {'ALIVE' if i in alive else 'down'} (pid {self.worker_pid(i)})"
                    for i in range(self.workers)
                )
                apps = len(state.get("activeapps") or [])
                detail += f"; workers {workers}; {apps} running application(s)"
        logs = (self.master_log, *(self.worker_log(i) for i in range(self.workers)))
        return Status(self.name, pid is not None, pid, detail, logs)

    # -- what drivers need ------------------------------------------------------------------

    def driver_conf(self) -> dict[str, str]:
        """Spark conf of a driver, in a process of its own, that runs on this cluster: the
        master, executors of 512 MB and 1 core, at most 2 cores (one executor per worker),
        the extra jars of `spark.py` (shipped to the executors by the driver) and the rest of
        spark.py's DEFAULT_CONF. The driver's process must have PYSPARK_PYTHON set to the
        interpreter its executors' Python workers should run (`driver_env()`): pyspark
        takes it from the driver's environment, not from the conf or the worker.
        The executors' Python workers also get this checkout on their PYTHONPATH: they start
        in the executor's work folder, where the tests' own modules (a test's sink wrapper
        pickled by reference) would not import; under local[2] they inherit the driver's."""
        jars = ",".join(str(j) for j in Spark(self.layout).extra_jars())
        return {
            **DEFAULT_CONF,
            "spark.master": self.master_url,
            **EXECUTOR_CONF,
            "spark.jars": jars,
            "spark.executorEnv.PYTHONPATH": str(REPO_ROOT),
        }

    def driver_env(self) -> dict[str, str]:
        """Environment variables a driver process needs beside `driver_conf()`."""
        return {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}

    # -- control for executor-loss tests ----------------------------------------------------

    def master_pid(self) -> int | None:
        return read_pid(self.master_pid_file)

    def worker_pid(self, i: int) -> int | None:
        """Worker i's JVM, or None when it does not run."""
        self._check_index(i)
        return read_pid(self.worker_pid_file(i))

    def master_state(self) -> dict[str, Any] | None:
        """The master's JSON (`workers`, `activeapps`, `completedapps`, ... each with its
        `state`), or None when it does not answer."""
        try:
            url = f"{self.webui_url}/json/"
            with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (http)
                state: dict[str, Any] = json.loads(response.read())
        except (OSError, ValueError):
            return None
        return state

    def workers_alive(self, state: dict[str, Any] | None = None) -> list[int]:
        """Indexes of the workers whose JVM runs and that the master lists ALIVE."""
        state = state if state is not None else self.master_state()
        if state is None:
            return []
        return [i for i in self._listed_alive(state) if self.worker_pid(i) is not None]

    def _listed_alive(self, state: dict[str, Any] | None) -> list[int]:
        """Indexes of the workers the master lists ALIVE, whether their JVM runs or not."""
        alive_ports = {
            int(w.get("port", -1))
            for w in (state or {}).get("workers") or []
            if w.get("state") == "ALIVE"
        }
        return [i for i, port in enumerate(self.ports.workers) if port in alive_ports]

    def active_apps(self) -> list[dict[str, Any]]:
        """The applications (drivers) the master runs now, as its JSON lists them."""
        state = self.master_state() or {}
        apps: list[dict[str, Any]] = state.get("activeapps") or []
        return apps

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until the master runs no application (a driver that just stopped or died is
        removed within a second or two); raise naming the ones still running after
        `timeout`: their drivers hold the cluster's cores."""
        try:
            wait_until(
                self.name,
                lambda: not self.active_apps(),
                timeout=timeout,
                what="the applications of earlier drivers to end",
            )
        except ServiceError:
            apps = ", ".join(f"{a.get('id')} ({a.get('name')})" for a in self.active_apps())
            raise ServiceError(
                self.name,
                f"applications still run on {self.master_url} after {timeout:.0f} s: {apps}. "
                "Their drivers (processes of an earlier test, or someone else's) hold the "
                f"cluster's cores; stop them (the master's web UI, {self.webui_url}, names "
                "them) or restart the cluster.",
                log=self.master_log,
            ) from None

    def executors(self) -> list[tuple[int, int]]:
        """(worker index, pid) of every live executor JVM (`CoarseGrainedExecutorBackend`,
        a child of a worker's JVM), by worker, then pid."""
        found = []
        for i in range(self.workers):
            worker = self.worker_pid(i)
            if worker is None:
                continue
            for pid in descendants(worker):
                if EXECUTOR_CLASS in _cmdline(pid) and pid_alive(pid):
                    found.append((i, pid))
        return sorted(found)

    def kill_executor(self, pid: int) -> None:
        """SIGKILL executor `pid` and its Python workers (an executor lost, no shutdown hook
        runs); returns once they are gone. Its worker then reports it failed, and the master
        has a worker start a replacement for the application."""
        if not any(pid == p for _, p in self.executors()):
            raise ValueError(f"pid {pid} is no executor of {self.name}: {self.executors()}")
        _kill_tree(self.name, pid, own_group=False)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker i's JVM, its executors and their Python workers (a host lost for
        good); returns once they are gone and the master no longer lists it ALIVE. A stopped
        worker is left alone."""
        self._stop_worker(i, kill=True)
        # The master's own view: a worker started again at the same address while the master
        # still lists the old one ALIVE is refused ("Attempted to re-register worker at same
        # address") and exits.
        wait_until(
            self.name,
            lambda: i not in self._listed_alive(self.master_state()),
            timeout=START_TIMEOUT,
            what=f"the master to see worker {i} lost",
            log=self.master_log,
        )

    def start_worker(self, i: int) -> None:
        """Start worker i if it does not run; return once it has registered (ALIVE)."""
        self._check_index(i)
        with self._exclusive():
            if self.worker_pid(i) is None:
                self._start_worker(i)
            self._wait_alive(i)

    # -- the rest ---------------------------------------------------------------------------

    def _check_index(self, i: int) -> None:
        if not 0 <= i < self.workers:
            raise IndexError(f"{self.name} has workers 0..{self.workers - 1}, not {i}")

    def _exclusive(self) -> contextlib.AbstractContextManager[None]:
        return file_lock(self.home / "up.lock")

    def _environment(self) -> dict[str, str]:
        """The daemons' environment: this one without Spark's and PySpark's variables (a
        test process may carry a driver's), plus the cluster's. Executors inherit it."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SPARK_", "PYSPARK_")) and k != "_JAVA_OPTIONS"
        }
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_CONF_DIR=str(self.home / "conf"),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            SPARK_DAEMON_JAVA_OPTS=f"-Dlog4j2.configurationFile=file:{self.log_config}",
            # Python workers run the interpreter the driver names (its PYSPARK_PYTHON); this
            # one is what anything started from the worker's environment would run.
            PYSPARK_PYTHON=sys.executable,
        )
        return env

    def _write_config(self) -> None:
        (self.home / "conf").mkdir(parents=True, exist_ok=True)
        level = os.environ.get("DS_SPARK_CLUSTER_LOG_LEVEL") or "warn"
        self.log_config.write_text(spark_log4j2(level, _OWN_LOGGER))
        self.daemon_conf.write_text("".join(f"{k} {v}\n" for k, v in _DAEMON_CONF.items()))

    def _require_same_spark(self) -> None:
        """Executors run the jars, and their Python workers the `pyspark.zip`, of the
        SPARK_HOME the cluster was started from (another checkout's, when checkouts share
        DS_SERVICES_DIR): a driver of another pyspark version would fail in odd ways, and a
        SPARK_HOME deleted since (a removed worktree) fails every new executor. Refuse both,
        saying what to do. The Python interpreter is the driver's business (PYSPARK_PYTHON),
        not the cluster's."""
        try:
            started: dict[str, str] = json.loads(self.state_file.read_text())
        except (FileNotFoundError, ValueError):
            return
        import pyspark

        home = Path(started.get("spark_home", ""))
        problem = None
        if not (home / "bin" / "spark-class").exists():
            problem = f"its SPARK_HOME, {home}, no longer exists"
        elif started.get("pyspark") != pyspark.__version__:
            problem = (
                f"it runs Spark {started.get('pyspark')} (from {home}), this interpreter has "
                f"pyspark {pyspark.__version__}"
            )
        if problem:
            raise ServiceError(
                self.name,
                f"the cluster at {self.master_url} (master pid {self.master_pid()}) was "
                f"started by {started.get('python')} and {problem}. Restart it: "
                f"`python -m tests.services down {self.name}`, then `up {self.name}`.",
            )

    def _spark_class(self, cls: str, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), cls, *args]

    def _start_master(self) -> None:
        require_java(self.name)
        Spark(self.layout).extra_jars()  # fetched now, not in the first driver_conf()
        ports = self.ports
        require_free_ports(self.name, {"master": ports.master, "master.webui": ports.master_webui})
        self._write_config()
        argv = self._spark_class(
            MASTER_CLASS,
            "--host",
            "127.0.0.1",
            "--port",
            str(ports.master),
            "--webui-port",
            str(ports.master_webui),
            "--properties-file",
            str(self.daemon_conf),
        )
        start_daemon(
            argv,
            log=self.master_log,
            pid_file=self.master_pid_file,
            env=self._environment(),
            cwd=self.home,
        )
        import pyspark

        self.state_file.write_text(
            json.dumps(
                {
                    "python": sys.executable,
                    "spark_home": str(spark_home()),
                    "pyspark": pyspark.__version__,
                },
                indent=2,
            )
        )

    def _start_worker(self, i: int) -> None:
        ports = self.ports
        require_free_ports(
            self.name,
            {f"worker-{i}": ports.workers[i], f"worker-{i}.webui": ports.worker_webuis[i]},
        )
        self._write_config()
        # A worker killed by other means than kill_worker may still be listed ALIVE for a
        # moment (until the master sees its connection drop, or for up to a minute without
        # heartbeats): a new one at its address would be refused.
        wait_until(
            self.name,
            lambda: i not in self._listed_alive(self.master_state()),
            timeout=START_TIMEOUT,
            what=f"the master to drop the old worker {i} before it starts again",
            log=self.master_log,
        )
        work = self.work_dir(i)
        local = self.home / "tmp" / f"worker-{i}"
        work.mkdir(parents=True, exist_ok=True)
        # What a killed worker's executors left there (~11 MB each: fetched jars, blocks) has
        # no owner any more: a worker cleans its applications' folders only while it lives.
        remove_tree(local)
        local.mkdir(parents=True)
        argv = self._spark_class(
            WORKER_CLASS,
            self.master_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(ports.workers[i]),
            "--webui-port",
            str(ports.worker_webuis[i]),
            "--cores",
            str(WORKER_CORES),
            "--memory",
            WORKER_MEMORY,
            "--work-dir",
            str(work),
            "--properties-file",
            str(self.daemon_conf),
        )
        # Shuffle files and blocks of its executors go under the service folder.
        env = {**self._environment(), "SPARK_LOCAL_DIRS": str(local)}
        start_daemon(argv, log=self.worker_log(i), pid_file=self.worker_pid_file(i), env=env)

    def _wait_alive(self, i: int) -> None:
        wait_until(
            self.name,
            lambda: i in self.workers_alive(),
            timeout=START_TIMEOUT,
            what=f"worker {i} (127.0.0.1:{self.ports.workers[i]}) to register with the master",
            log=self.worker_log(i),
            alive=lambda: self.worker_pid(i) is not None,
        )

    def _stop_worker(self, i: int, *, kill: bool) -> None:
        pid = self.worker_pid(i)
        if pid is not None:
            _kill_tree(self.name, pid, own_group=True, kill=kill)
            wait_ports_released(
                self.name,
                {
                    f"worker-{i}": self.ports.workers[i],
                    f"worker-{i}.webui": self.ports.worker_webuis[i],
                },
            )
        self.worker_pid_file(i).unlink(missing_ok=True)


def spark_home() -> Path:
    """The pyspark wheel's folder: a SPARK_HOME (bin/, jars/) of the installed version."""
    import pyspark

    return Path(pyspark.__file__).parent


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _kill_tree(service: str, pid: int, *, own_group: bool, kill: bool = True) -> None:
    """Stop `pid` and every process below it, whatever their process group (PySpark's worker
    daemon makes a group of its own, which its Python workers join).

    `own_group`: pid leads a process group of its own (a daemon started by `start_daemon`),
    which is signalled whole; otherwise (an executor, in its worker's group) only pid itself
    and the groups below it that are neither its parent's nor ours. `kill`: SIGKILL at once;
    else SIGTERM first (shutdown hooks run), SIGKILL what is left after a while.
    """
    below = descendants(pid)
    spared = {os.getpgrp()}
    if not own_group:
        spared.add(process_group(pid) or -1)
    groups = [pid] if own_group else []
    singles = [] if own_group else [pid]
    for child in below:
        group = process_group(child)
        if group is None or group in spared or group in groups:
            continue
        groups.append(group)
    if not own_group:
        # Executors' own children that stayed in the worker's group (none seen) die one by one.
        singles += [c for c in below if process_group(c) == process_group(pid)]
    if not kill:
        for group in groups:
            stop_group(service, group, timeout=30.0 if group == pid else 10.0)
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    for single in singles:
        with contextlib.suppress(ProcessLookupError):
            os.kill(single, signal.SIGKILL)
    everything = [pid, *below]
    wait_until(
        service,
        lambda: not any(pid_alive(p) for p in everything),
        timeout=30.0,
        what=f"processes {everything} to exit after SIGKILL",
    )
    _reap(everything)


def _reap(pids: list[int]) -> None:
    """Collect those that are our own children (none usually: daemons are detached)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
