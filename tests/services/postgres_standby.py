"""A Postgres primary and a streaming standby (service `postgres-standby`), for failover tests.

Two clusters of the `Postgres` class's making, `a` and `b`, on the layout's
`postgres_standby` ports (15632 and 15633 by default). One is the primary (a cluster made by
initdb), the other a hot standby copied from it by `pg_basebackup -R` and streaming its WAL,
in one of two modes:

- `sync`: the primary's `synchronous_standby_names` names the standby and
  `synchronous_commit=on`, so a commit (and a PREPARE TRANSACTION, and a COMMIT PREPARED) is
  acknowledged only once the standby has flushed its WAL: a promoted standby holds every
  transaction the primary acknowledged, prepared ones included.
- `async`: the primary acknowledges at its own flush; a standby that lags at the primary's
  crash misses the last acknowledged transactions (`hold_wal()` makes it lag on purpose).

`fail_over()` SIGKILLs the primary, promotes the standby and clears
`synchronous_standby_names` on it (it has no standby: every commit would wait forever). The
old primary is then *retired*: `up` never starts it again (two writable servers, a split
brain); its data stays until `reset` or `rebuild_standby`. Which server holds which role is
kept in `state.json` in the service's folder, so `up` after a failover starts the new primary
alone.

Clients reach the pair by `endpoint()`, one connection string naming both servers with
`target_session_attrs=read-write` (libpq tries them in order and takes the one that accepts
writes: the primary, and after a failover the promoted standby). Both servers share the
superuser's password (the standby is a copy); it is never printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from ._layout import Layout, PostgresPorts
from ._process import ServiceError, run, wait_until
from ._service import Status, remove_tree
from .endpoints import PostgresEndpoint
from .postgres import SUPERUSER, Postgres, _as_postgres, _chown_postgres

NAME = "postgres-standby"
#: The standby's name towards its primary (`application_name`, `synchronous_standby_names`).
STANDBY_NAME = "standby"
#: A port nothing listens on: the standby's `primary_conninfo` points there while the WAL
#: stream is held back (each attempt is refused at once).
_NOWHERE_PORT = 1
#: Smaller than the main bed's (256MB): two more servers on a shared machine.
_PAIR_SETTINGS = {
    "shared_buffers": "64MB",
    "max_wal_size": "512MB",
    "hot_standby": "on",
    # lets pg_rewind turn a retired primary into a standby (docs/postgres.md)
    "wal_log_hints": "on",
    "wal_sender_timeout": "10s",
    "wal_receiver_status_interval": "1s",
}

Mode = Literal["sync", "async"]
Slot = Literal["a", "b"]
SLOTS: tuple[Slot, Slot] = ("a", "b")


@dataclass(frozen=True)
class PairState:
    """Who is what: the replication mode, the primary's slot, the standby's slot (None after
    a failover until `rebuild_standby`)."""

    mode: Mode = "sync"
    primary: Slot = "a"
    standby: Slot | None = "b"

    @property
    def retired(self) -> Slot | None:
        """The slot that is neither primary nor standby (the old primary after a failover)."""
        taken = {self.primary, self.standby}
        free = [slot for slot in SLOTS if slot not in taken]
        return free[0] if free else None


class PairServer(Postgres):
    """One server of the pair: a `Postgres` cluster whose settings follow its role, and
    which, as a standby, is made by copying the primary (`pg_basebackup -R`)."""

    def __init__(self, pair: PostgresPair, slot: Slot, port: int) -> None:
        root = pair.home / slot
        super().__init__(
            replace(pair.layout, root=root, postgres=PostgresPorts(port=port)),
            name=f"{NAME}:{slot}",
        )
        self.pair = pair
        self.slot = slot

    def _build(self, binaries: Path) -> tuple[str, Callable[[Path], None]]:
        state = self.pair.state()
        if state.standby != self.slot:
            return super()._build(binaries)
        primary = self.pair.server(state.primary)

        def copy(staging: Path) -> None:
            password = primary.endpoint().password
            _write_secret(self.password_file, password)
            _chown_postgres(staging)
            os.chmod(staging, 0o700)
            env = {**os.environ, "PGPASSWORD": password}  # kept out of argv and errors
            run(
                self.name,
                [
                    *_as_postgres(),
                    str(binaries / "pg_basebackup"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(primary.port),
                    "-U",
                    SUPERUSER,
                    "-D",
                    str(staging),
                    "-R",  # standby.signal (primary_conninfo is among the settings)
                    "--checkpoint=fast",
                    "--wal-method=stream",
                    "--no-sync",  # the set-up step syncs the folder before publishing it
                ],
                env=env,
                timeout=120,
            )

        return "streaming standby (pg_basebackup)", copy

    def _settings(self) -> dict[str, str]:
        return {**super()._settings(), **_PAIR_SETTINGS, **self.pair.role_settings(self.slot)}

    def reload(self) -> None:
        """Write the settings of its current role and have the running server read them."""
        self._apply_settings()
        import psycopg

        with psycopg.connect(self.endpoint().conninfo(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")


class PostgresPair:
    """The service: a primary and a streaming standby (see the module docstring).

    `up` starts the current primary, then the standby (made from the primary when missing)
    and waits until it streams; `reset(mode)` makes a fresh pair in `mode`, which is also how
    a test chooses the mode.
    """

    def __init__(self, layout: Layout) -> None:
        self.name = NAME
        self.layout = layout
        self.home = layout.service_dir(NAME)
        self.state_file = self.home / "state.json"
        ports = layout.postgres_standby
        self.servers: dict[Slot, PairServer] = {
            "a": PairServer(self, "a", ports.primary),
            "b": PairServer(self, "b", ports.standby),
        }
        #: Set while `hold_wal()` keeps the standby from the primary's WAL.
        self._held = False

    # -- roles -------------------------------------------------------------------------------
    def state(self) -> PairState:
        try:
            raw = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return PairState()
        return PairState(raw["mode"], raw["primary"], raw["standby"])

    def _save(self, state: PairState) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        temporary = self.state_file.with_suffix(".tmp")
        temporary.write_text(
            json.dumps({"mode": state.mode, "primary": state.primary, "standby": state.standby})
        )
        temporary.replace(self.state_file)

    def server(self, slot: Slot) -> PairServer:
        return self.servers[slot]

    @property
    def primary(self) -> PairServer:
        return self.servers[self.state().primary]

    @property
    def standby(self) -> PairServer:
        """The standby; a pair that failed over has none (`rebuild_standby` makes one)."""
        slot = self.state().standby
        if slot is None:
            raise ServiceError(
                self.name,
                "the pair has no standby since its failover: call rebuild_standby() or reset(mode)",
            )
        return self.servers[slot]

    def role_settings(self, slot: Slot) -> dict[str, str]:
        """The settings a server's role gives it: the primary names its standby in `sync`
        mode (and nothing otherwise, after a failover included); the standby streams from
        the primary (or from nowhere while the WAL is held back)."""
        state = self.state()
        if slot == state.standby:
            primary = self.servers[state.primary]
            port = _NOWHERE_PORT if self._held else primary.port
            conninfo = (
                f"host=127.0.0.1 port={port} user={SUPERUSER} "
                f"password={primary.endpoint().password} application_name={STANDBY_NAME} "
                "connect_timeout=2"
            )
            return {"primary_conninfo": f"'{conninfo}'"}
        names = (
            STANDBY_NAME
            if slot == state.primary and state.mode == "sync" and state.standby is not None
            else ""  # a primary without standby, or a retired one started alone
        )
        return {"synchronous_standby_names": f"'{names}'"}

    # -- endpoints ---------------------------------------------------------------------------
    def endpoint(self) -> PostgresEndpoint:
        """Both servers in one connection string (`target_session_attrs=read-write`): what a
        job is given. It reaches whichever server is primary now."""
        first = self.servers["a"].endpoint()
        second = self.servers["b"]
        return replace(first, more_hosts=(("127.0.0.1", second.port),))

    def primary_endpoint(self) -> PostgresEndpoint:
        """The current primary alone (set-up and inspection)."""
        return self.primary.endpoint()

    def standby_endpoint(self) -> PostgresEndpoint:
        """The standby alone (read-only queries)."""
        return self.standby.endpoint()

    # -- lifecycle ---------------------------------------------------------------------------
    def up(self) -> None:
        state = self.state()
        self._save(state)
        self.servers[state.primary].up()
        if state.standby is not None:
            self.servers[state.standby].up()
            self.wait_streaming()

    def down(self) -> None:
        for server in self.servers.values():
            server.down()

    def reset(self, mode: Mode | None = None) -> None:
        """Stop both servers, delete their data and, given a `mode`, make a fresh pair in it
        (a new cluster and a standby copied from it, streaming: 5-10 s). Without a mode (the
        command line's `reset`) the pair is left deleted."""
        for server in self.servers.values():
            server.reset()
        remove_tree(self.home)
        if mode is not None:
            self._save(PairState(mode=mode))
            self.up()

    def status(self) -> Status:
        state = self.state()
        parts = []
        pids = []
        for slot, server in self.servers.items():
            role = (
                "primary"
                if slot == state.primary
                else "standby"
                if slot == state.standby
                else "retired"
            )
            pid = server.postmaster_pid()
            if pid is not None:
                pids.append(pid)
            parts.append(f"{role} 127.0.0.1:{server.port} " + ("up" if pid else "down"))
        detail = f"{state.mode}: " + ", ".join(parts)
        logs = tuple(server.log for server in self.servers.values())
        return Status(self.name, bool(pids), pids[0] if pids else None, detail, logs)

    # -- faults ------------------------------------------------------------------------------
    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and every child of it (a power cut: no shutdown
        checkpoint, no last WAL sent)."""
        self.primary.crash()

    def promote(self) -> float:
        """Promote the standby (`pg_promote()`, waiting until it is done), make it the primary
        and the old primary retired, and clear `synchronous_standby_names` on the new primary;
        return the seconds until the new primary accepts a write."""
        state = self.state()
        standby = self.standby
        started = time.monotonic()
        import psycopg

        with psycopg.connect(standby.endpoint().conninfo(), autocommit=True) as conn:
            row = conn.execute("SELECT pg_promote(true, 60)").fetchone()
        if row is None or not row[0]:
            raise ServiceError(
                standby.name, "pg_promote() did not finish within 60 s", log=standby.log
            )
        self._held = False
        self._save(replace(state, primary=standby.slot, standby=None))
        standby.reload()  # synchronous_standby_names '' (and primary_conninfo gone)
        wait_until(
            standby.name,
            lambda: _accepts_writes(standby),
            timeout=60,
            what="the promoted standby to accept a write",
            log=standby.log,
        )
        return time.monotonic() - started

    def fail_over(self) -> float:
        """Kill the primary, promote the standby (see `promote`); return the seconds from the
        kill until the new primary accepted a write. The old primary stays down."""
        started = time.monotonic()
        self.kill_primary()
        self.promote()
        return time.monotonic() - started

    def rebuild_standby(self) -> None:
        """After a failover: delete the retired primary's data and make it a standby of the new
        primary (a copy, streaming, in the pair's mode). Its unreplicated transactions, if
        any, are gone with it."""
        state = self.state()
        retired = state.retired
        if retired is None:
            raise ServiceError(self.name, "the pair has a standby already")
        self.servers[retired].reset()
        self._save(replace(state, standby=retired))
        self.servers[retired].up()
        self.primary.reload()  # names the standby again in sync mode
        self.wait_streaming()

    @contextlib.contextmanager
    def retired_alone(self) -> Iterator[PostgresEndpoint]:
        """After a failover: the old primary started alone on a port of its own (the layout's
        `postgres_standby.alone`, which the pair's connection string does not name), for a
        repair to read what it holds that the new primary lost; stopped again (fast) when
        the block ends. It runs as a primary without standby (its WAL recovered from the
        kill): never give its endpoint to a job."""
        state = self.state()
        slot = state.retired
        if slot is None:
            raise ServiceError(self.name, "no server is retired: fail_over() first")
        alone = PairServer(self, slot, self.layout.postgres_standby.alone)  # its data, own port
        try:
            alone.up()
            yield alone.endpoint()
        finally:
            alone.stop("fast")

    @contextlib.contextmanager
    def hold_wal(self) -> Iterator[None]:
        """Keep the standby from the primary's WAL (async mode only: in sync mode every commit
        would wait): its `primary_conninfo` points at a closed port until the block ends, so
        what the primary commits meanwhile is on the primary alone. What it committed before
        is on the standby (the block waits until the standby replayed it). A failover inside
        the block loses what came later. On leaving, a standby still a standby streams
        again."""
        if self.state().mode != "async":
            raise ServiceError(
                self.name,
                "hold_wal() needs an async pair (a sync primary's commits would wait for the "
                "held standby forever): reset('async') first",
            )
        standby = self.standby
        self.wait_caught_up()
        self._held = True
        try:
            standby.reload()
            wait_until(
                self.name,
                lambda: not self._streaming(),
                timeout=30,
                what="the standby to stop streaming",
                log=standby.log,
            )
            yield
        finally:
            self._held = False
            if self.state().standby == standby.slot:
                standby.reload()
                self.wait_streaming()

    # -- inspection --------------------------------------------------------------------------
    def wait_streaming(self, timeout: float = 60.0) -> None:
        """Wait until the standby streams from the primary (in sync mode: as its synchronous
        standby, so that from then on every commit waits for it)."""
        standby = self.standby
        wait_until(
            self.name,
            self._streaming,
            timeout=timeout,
            what=f"the standby (port {standby.port}) to stream from the primary",
            log=standby.log,
        )

    def wait_caught_up(self, timeout: float = 60.0) -> None:
        """Wait until the standby has replayed all the WAL the primary had written when
        called (in either mode: a synchronous standby acknowledges a flush, not a replay)."""
        import psycopg

        with psycopg.connect(self.primary.endpoint().conninfo(), autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        target = row[0]
        standby = self.standby

        def replayed() -> bool:
            with psycopg.connect(standby.endpoint().conninfo(), autocommit=True) as conn:
                done = conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)
                ).fetchone()
            return done is not None and bool(done[0])

        wait_until(
            self.name,
            replayed,
            timeout=timeout,
            what=f"the standby to replay the primary's WAL up to {target}",
            log=standby.log,
        )

    def _streaming(self) -> bool:
        import psycopg

        state = self.state()
        wanted = "sync" if state.mode == "sync" else "async"
        try:
            with psycopg.connect(
                self.primary.endpoint().conninfo(connect_timeout="3"), autocommit=True
            ) as conn:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication "
                    "WHERE application_name = %s AND state = 'streaming'",
                    (STANDBY_NAME,),
                ).fetchone()
        except psycopg.Error:
            return False
        return row is not None and row[0] == wanted


def _accepts_writes(server: Postgres) -> bool:
    import psycopg

    try:
        with psycopg.connect(
            server.endpoint().conninfo(connect_timeout="3"), autocommit=True
        ) as conn:
            conn.execute("SET statement_timeout = '5s'")
            conn.execute("CREATE TEMP TABLE failover_probe (x int)")
            conn.execute("SELECT txid_current()")
    except psycopg.Error:
        return False
    return True


def _write_secret(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")


__all__ = ["NAME", "Mode", "PairServer", "PairState", "PostgresPair"]
