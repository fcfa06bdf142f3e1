"""PostgreSQL from Debian's packages: a cluster of our own, made by initdb, on 127.0.0.1.

The cluster runs as the `postgres` system user (initdb refuses root) with
`max_prepared_transactions` raised for two-phase commit, fsync on, password (SCRAM) auth over
TCP and no Unix socket. The superuser's password is random per cluster and kept in a 0600 file
beside it; it is never printed.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import pwd
import secrets
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from ._layout import Layout
from ._process import (
    ServiceError,
    pid_alive,
    require_free_ports,
    run,
    tail,
    wait_ports_released,
    wait_until,
)
from ._service import Status, remove_tree
from ._steps import COMPLETE, ensure_folder, is_complete
from ._system import apt_install
from .endpoints import PostgresEndpoint
from .tls import TestbedTls

NAME = "postgres"
MAX_PREPARED_TRANSACTIONS = 256
SUPERUSER = "postgres"
START_TIMEOUT = 60.0
#: Where clusters of checkouts the postgres user cannot reach live (see Postgres._home).
_FALLBACK_HOMES = Path("/var/tmp/durable-sinks")

SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "max_connections": "200",
    "max_prepared_transactions": str(MAX_PREPARED_TRANSACTIONS),
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "shared_buffers": "256MB",
    "max_wal_size": "2GB",
    "log_min_messages": "warning",
    "log_line_prefix": "'%m [%p] %q%u@%d '",
}


def bin_dir() -> Path | None:
    """The newest installed server's bin folder (/usr/lib/postgresql/<v>/bin), if any."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


def ensure_installed() -> Path:
    """Install Debian's `postgresql` package when no server is installed; return its bin."""
    found = bin_dir()
    if found is None:
        apt_install(NAME, ["postgresql"], "no PostgreSQL server is installed")
        found = bin_dir()
    if found is None:
        raise ServiceError(
            NAME, "`postgresql` is installed but no /usr/lib/postgresql/*/bin/initdb exists"
        )
    return found


StopMode = Literal["fast", "immediate"]


@dataclass(frozen=True)
class PreparedTransaction:
    """A row of `pg_prepared_xacts`: a transaction prepared and not yet committed or rolled
    back (it keeps its locks and survives restarts, crashes included)."""

    gid: str
    database: str
    owner: str
    prepared: datetime


class Postgres:
    """One cluster. `name` tells the main bed's (`postgres`) from the faults bed's
    (`faults-postgres`) in messages and `status`; the folders come from the layout."""

    def __init__(self, layout: Layout, name: str = NAME) -> None:
        self.name = name
        self.layout = layout
        self.port = layout.postgres.port
        self.home = self._home(layout.service_dir(NAME))
        self.data = self.home / "data"
        self.log = self.home / "postgres.log"
        self.password_file = layout.service_dir(NAME + "-password")

    # The cluster's folder must be reachable by the postgres user. A checkout under a folder
    # it cannot traverse (say /root) gets its cluster under /var/tmp, keyed by the checkout.
    @staticmethod
    def _home(wanted: Path) -> Path:
        if os.geteuid() != 0 or _traversable_by_postgres(wanted.parent):
            return wanted
        key = hashlib.sha256(str(wanted).encode()).hexdigest()[:12]
        return _FALLBACK_HOMES / key / NAME

    def endpoint(self) -> PostgresEndpoint:
        try:
            password = self.password_file.read_text().strip()
        except FileNotFoundError:
            raise ServiceError(
                self.name,
                f"no cluster has been made yet ({self.password_file} is "
                "missing): run `python -m tests.services up`",
            ) from None
        return PostgresEndpoint(
            "127.0.0.1",
            self.port,
            SUPERUSER,
            password,
            tls=TestbedTls(self.layout.service_dir("tls")),
        )

    # -- lifecycle -------------------------------------------------------------------------
    def postmaster_pid(self) -> int | None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None
        return pid if pid_alive(pid) else None

    def up(self) -> None:
        if self.postmaster_pid() is not None:
            wait_until(
                self.name,
                self.accepts_queries,
                timeout=START_TIMEOUT,
                what="the running server to accept queries",
                log=self.log,
            )
            return
        require_free_ports(self.name, {"port": self.port})
        binaries = ensure_installed()
        self._ensure_cluster(binaries)
        # After a crash the lock file names a dead postmaster. Postgres checks it with kill(0),
        # which a zombie (an unreaped child of an init that does not reap) still passes.
        (self.data / "postmaster.pid").unlink(missing_ok=True)
        self._apply_settings()
        self.log.touch(exist_ok=True)
        _chown_postgres(self.log)
        run(
            self.name,
            [
                *_as_postgres(),
                str(binaries / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-w",
                "-t",
                str(int(START_TIMEOUT)),
                "start",
            ],
            timeout=START_TIMEOUT + 30,
            fix=f"See the server log {self.log}.",
        )
        wait_until(
            self.name,
            self.accepts_queries,
            timeout=START_TIMEOUT,
            what="the server to accept an authenticated query",
            log=self.log,
        )

    def down(self) -> None:
        self.stop("fast")

    def stop(self, mode: StopMode = "fast") -> None:
        """`pg_ctl stop -m <mode>`; returns once every server process is gone and the port is
        free. `fast` rolls back open transactions and checkpoints; `immediate` quits without a
        checkpoint (recovery replays the WAL at the next start). Prepared transactions survive
        both. A stopped server is left alone."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        children = _children(pid)
        binaries = ensure_installed()
        run(
            self.name,
            [
                *_as_postgres(),
                str(binaries / "pg_ctl"),
                "-D",
                str(self.data),
                "-m",
                mode,
                "-w",
                "-t",
                "60",
                "stop",
            ],
            timeout=90,
        )
        self._wait_gone(pid, *children)

    def start(self) -> None:
        """Start a stopped server and wait until it accepts an authenticated query (after an
        immediate stop or a crash that includes WAL recovery)."""
        self.up()

    def restart(self, mode: StopMode = "immediate", down_seconds: float = 0.0) -> float:
        """Stop with `mode`, stay down `down_seconds`, start; return the seconds from the
        stop's start until queries are accepted again."""
        started = time.monotonic()
        self.stop(mode)
        if down_seconds > 0:
            time.sleep(down_seconds)
        self.start()
        return time.monotonic() - started

    def prepared_transactions(self) -> list[PreparedTransaction]:
        """Every prepared transaction of the cluster (all databases), oldest first."""
        import psycopg

        with psycopg.connect(self.endpoint().conninfo(), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT gid, database, owner, prepared FROM pg_prepared_xacts ORDER BY prepared"
            ).fetchall()
        return [PreparedTransaction(*row) for row in rows]

    def crash(self) -> None:
        """Stop the server the way a power cut would: SIGKILL the postmaster and all its
        children, no shutdown checkpoint. What was durable before must survive `up`."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        children = _children(pid)
        for victim in (pid, *children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        self._wait_gone(pid, *children)

    def reset(self) -> None:
        self.down()
        remove_tree(self.home)
        if self.home.parent.parent == _FALLBACK_HOMES:  # the checkout's key folder, if now empty
            with contextlib.suppress(OSError):
                self.home.parent.rmdir()
        with contextlib.suppress(FileNotFoundError):
            self.password_file.unlink()

    def status(self) -> Status:
        pid = self.postmaster_pid()
        if pid is None:
            detail = f"127.0.0.1:{self.port}, data {self.data}"
        else:
            ok = self.accepts_queries()
            detail = f"127.0.0.1:{self.port} user={SUPERUSER} " + (
                "(accepting queries)" if ok else "(NOT accepting queries)"
            )
        return Status(self.name, pid is not None, pid, detail, (self.log,))

    def accepts_queries(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.endpoint().conninfo(connect_timeout="3")) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    # -- cluster creation ------------------------------------------------------------------
    def _ensure_cluster(self, binaries: Path) -> None:
        """Make the cluster once (a set-up step, tests/services/_steps.py): initdb runs into a
        staging folder, which becomes `data` by rename only when it succeeded, so a cluster
        whose initdb was killed half-way is never started; the next `up` makes it again."""
        made = (self.data / "global" / "pg_control").exists()
        if made and not is_complete(self.data):  # a cluster of an older test bed, whole
            (self.data / COMPLETE).write_text("Postgres cluster\n")
            _chown_postgres(self.data / COMPLETE)
        self.home.mkdir(parents=True, exist_ok=True)
        _chown_postgres(self.home)
        step, build = self._build(binaries)
        ensure_folder(self.name, step, self.data, build)
        _chown_postgres(self.data / COMPLETE)

    def _build(self, binaries: Path) -> tuple[str, Callable[[Path], None]]:
        """How the cluster's data folder is made (into the staging folder it is given), and
        the set-up step's name for errors: a new cluster by initdb here; a streaming standby
        copies its primary instead."""
        return "Postgres cluster (initdb)", self._initdb(binaries)

    def _initdb(self, binaries: Path) -> Callable[[Path], None]:
        def build(staging: Path) -> None:
            self.password_file.parent.mkdir(parents=True, exist_ok=True)
            password = secrets.token_urlsafe(18)
            fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(password + "\n")
            pwfile = self.home / "initdb.pw"
            pwfile.write_text(password + "\n")
            _chown_postgres(staging)
            _chown_postgres(pwfile)
            try:
                run(
                    self.name,
                    [
                        *_as_postgres(),
                        str(binaries / "initdb"),
                        "-D",
                        str(staging),
                        "-U",
                        SUPERUSER,
                        f"--pwfile={pwfile}",
                        "--auth-host=scram-sha-256",
                        "--auth-local=peer",
                        "--encoding=UTF8",
                        "--locale=C.UTF-8",
                        "--no-sync",  # the set-up step syncs the folder before publishing it
                    ],
                    timeout=180,
                )
            finally:
                pwfile.unlink(missing_ok=True)

        return build

    def _apply_settings(self) -> None:
        conf = self.data / "postgresql.auto.conf"
        lines = ["# Written by tests/services/postgres.py on every start."]
        lines += [f"{key} = {value}" for key, value in self._settings().items()]
        conf.write_text("\n".join(lines) + "\n")
        _chown_postgres(conf)

    def _settings(self) -> dict[str, str]:
        """Every setting written into postgresql.auto.conf at each start (and reload)."""
        return {**SETTINGS, **self._tls_settings(), "port": str(self.port)}

    def _tls_settings(self) -> dict[str, str]:
        """TLS with the test bed's certificate (tests/services/tls.py): clients may connect
        with or without it (the endpoint's `conninfo` without, `tls_conninfo` with
        `sslmode=verify-full`). Postgres wants its key owned by its user and mode 0600: it
        gets copies in the cluster's folder."""
        tls = TestbedTls(self.layout.service_dir("tls")).ensure()
        copies = {
            "ssl_cert_file": self.home / "server.pem",
            "ssl_key_file": self.home / "server.key",
        }
        shutil.copyfile(tls.server_cert, copies["ssl_cert_file"])
        shutil.copyfile(tls.server_key, copies["ssl_key_file"])
        for path in copies.values():
            os.chmod(path, 0o600)
            _chown_postgres(path)
        return {"ssl": "on", **{key: f"'{path}'" for key, path in copies.items()}}

    def _wait_gone(self, *pids: int) -> None:
        deadline = time.monotonic() + 60
        while any(pid_alive(p) for p in pids):
            if time.monotonic() > deadline:
                raise ServiceError(
                    self.name, f"processes {pids} still alive 60 s after stop\n" + tail(self.log)
                )
            time.sleep(0.1)
        wait_ports_released(self.name, {"port": self.port})


def _as_postgres() -> list[str]:
    """Prefix that runs a command as the postgres user when we are root."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    return [runuser, "-u", SUPERUSER, "--"]


def _postgres_ids() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(SUPERUSER)
    except KeyError:
        raise ServiceError(
            NAME,
            "there is no `postgres` system user; (re)install Debian's "
            "`postgresql` package, which creates it",
        ) from None
    return entry.pw_uid, entry.pw_gid


def _chown_postgres(path: Path) -> None:
    if os.geteuid() != 0:
        return
    uid, gid = _postgres_ids()
    os.chown(path, uid, gid)


def _traversable_by_postgres(folder: Path) -> bool:
    """True when the postgres user can reach `folder` (every ancestor searchable by others,
    or owned by postgres)."""
    uid, _ = _postgres_ids()
    current = folder
    while True:
        try:
            st = current.stat()
        except FileNotFoundError:
            current = current.parent
            continue
        if st.st_uid != uid and not st.st_mode & 0o001:
            return False
        if current.parent == current:
            return True
        current = current.parent


def _children(pid: int) -> list[int]:
    try:
        raw = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in raw.split()]
