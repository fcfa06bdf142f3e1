"""Connections to Postgres, shared by the Postgres sink and the Postgres decision store: what a
failed connection means (the server is unreachable for now, retriable; or it answered and
refused the DSN, a configuration to fix), whether an error means the session was lost, the
server a DSN names (for messages, without credentials), the sessions' application_name, and
sessions whose waits are bounded (`bounded_connect`).
It loads no database client at import (psycopg is imported inside the functions that parse a
DSN or look at a psycopg error, which only the sink and the store call); without psycopg
installed, the message helpers (`connection_failure`, `server_of`) show no part of the DSN and
`connection_lost` is False."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from durable_sinks.core.errors import ConfigError, UnreachableError
from durable_sinks.core.formats import StoredFormat
from durable_sinks.core.redaction import redact

if TYPE_CHECKING:
    import psycopg
    import psycopg.sql

#: Phrases of libpq's (and the server's FATAL) messages when the server answered and refused
#: the connection's settings: retrying cannot help.
_REFUSED_SETTINGS = (
    # TLS first: libpq's "root certificate file ... does not exist" is no missing database.
    (
        "root certificate file",
        "give sslrootcert the path of the CA file that signed the server's certificate (or "
        "sslrootcert=system for the system's CAs)",
    ),
    (
        "certificate verify failed",
        "set sslrootcert to the CA that signed the server's certificate (sslmode=verify-ca "
        "and verify-full check it)",
    ),
    (
        "does not match host name",
        "connect with a host name the server's certificate names (host=...; sslmode="
        "verify-full checks it), or give the server a certificate for this name",
    ),
    ("certificate has expired", "renew the server's certificate"),
    (
        "server does not support ssl",
        "turn ssl on in the server's postgresql.conf, or choose a lower sslmode",
    ),
    (
        "authentication failed",
        "check the user and password (DSN, PGPASSWORD, PGPASSFILE or ~/.pgpass); the "
        "role's password may have expired (VALID UNTIL) or been changed",
    ),
    ("no password supplied", "give the password (DSN, PGPASSWORD or ~/.pgpass)"),
    ("pg_hba.conf", "allow this host and user in the server's pg_hba.conf"),
    ("does not exist", "create the database or role, or fix dbname/user in the DSN"),
    ("permission denied", "GRANT CONNECT ON DATABASE ... to the job's user"),
    ("invalid port", "fix the port in the DSN"),
)


def connection_failure(
    message: str,
    dsn: str,
    *,
    where: str | None = None,
    job: str | None = None,
    sink: str | None = None,
    epoch: int | None = None,
) -> ConfigError | UnreachableError:
    """The error for a failed connect: `message` is the driver's first line, `dsn` is shown
    without its password, `where` says whose connection it is (e.g. "the job's decision
    store, in the database of postgres sink 'pg'")."""
    text = f"cannot connect to Postgres at {redact(dsn)}"
    text += f" ({where})" if where else ""
    text += f": {message}"
    lowered = message.lower()
    for phrase, fix in _REFUSED_SETTINGS:
        if phrase in lowered:
            return ConfigError(
                text, job=job, sink=sink, epoch=epoch, fix=f"{fix}; retrying cannot help"
            )
    return UnreachableError(
        text,
        job=job,
        sink=sink,
        epoch=epoch,
        fix="check that the server runs and that the DSN's host and port reach it "
        "(a firewall, DNS or connect_timeout); the job may be restarted once it answers",
    )


#: Seconds a connection attempt may take when neither the option nor the DSN says.
DEFAULT_CONNECT_TIMEOUT = 10


def connect_timeout(dsn: str, given: int | None) -> int:
    """The connection time-out to use: the option when given, else the DSN's own
    `connect_timeout` (which the option would otherwise silently override), else 10 s."""
    if given is not None:
        return given
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        value = conninfo_to_dict(dsn).get("connect_timeout")
        return int(str(value)) if value is not None else DEFAULT_CONNECT_TIMEOUT
    except (ProgrammingError, ValueError):
        return DEFAULT_CONNECT_TIMEOUT


# -- sessions that end under a job's feet ---------------------------------------------------------

#: SQLSTATEs of a session the server ended or would not start: 57P01 admin_shutdown
#: (pg_terminate_backend, a smart or fast shutdown), 57P02 crash_shutdown (an immediate
#: shutdown, or another backend crashed), 57P03 cannot_connect_now (starting up, shutting down,
#: in recovery), 57P05 idle_session_timeout and 25P03 idle_in_transaction_session_timeout (the
#: latter an InternalError in psycopg, not an OperationalError). Class 08 is a connection
#: exception.
SESSION_ENDED = frozenset({"57P01", "57P02", "57P03", "57P05", "25P03"})


def connection_lost(exc: BaseException) -> bool:
    """Whether a psycopg error means the session is gone (the server ended it, restarted, or
    the network dropped it), as opposed to a statement the server refused on a live session.
    Errors the client raises itself carry no SQLSTATE ("server closed the connection
    unexpectedly", "consuming input failed", "the connection is closed")."""
    try:
        import psycopg
    except ImportError:
        return False  # no psycopg error can have been raised without psycopg
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.OperationalError)
    return state in SESSION_ENDED or state.startswith("08")


def server_of(dsn: str) -> str:
    """`host:port/dbname` of a DSN, for messages: never the user or the password. Unset parts
    are what libpq would use (PGHOST, PGPORT, PGDATABASE, else localhost, 5432, the user). A
    DSN naming several servers (a primary and its standbys) gives each `host:port`, in the
    order libpq tries them: `h1:5432,h2:5433/dbname`."""
    import os

    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return "<a Postgres server: psycopg is not installed to read its DSN>"
    try:
        params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v not in (None, "")}
    except ProgrammingError:
        return "<a DSN libpq cannot read>"
    host = params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST") or "localhost"
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    hosts, ports = host.split(","), port.split(",")
    if len(ports) == 1:  # libpq: one port serves every host
        ports *= len(hosts)
    servers = (
        ",".join(f"{h}:{p}" for h, p in zip(hosts, ports, strict=True))
        if len(hosts) == len(ports)
        else f"{host}:{port}"  # libpq refuses such a DSN; shown as written
    )
    dbname = (
        params.get("dbname")
        or os.environ.get("PGDATABASE")
        or params.get("user")
        or os.environ.get("PGUSER")
        or "<the user's database>"
    )
    return f"{servers}/{dbname}"


#: `target_session_attrs` values under which libpq connects only to a server that takes writes.
WRITABLE_TARGETS = ("read-write", "primary")
#: What a DSN naming several servers must say, shown in the error when it does not.
SEVERAL_SERVERS_FIX = (
    "add target_session_attrs=read-write to the DSN (libpq then skips standbys and, after a "
    "failover, finds the promoted one), or name one server"
)


def may_reach_a_standby(params: Mapping[str, object]) -> bool:
    """Whether a parsed DSN names several servers (`host=a,b`) without asking libpq for the
    writable one (`target_session_attrs=read-write` or `primary`, in the DSN or
    PGTARGETSESSIONATTRS): libpq would then take the first that answers, which may be a
    read-only standby (every write refused) or, after a failover, an old primary restarted
    beside the new one."""
    import os

    hosts = str(params.get("host") or params.get("hostaddr") or "")
    if "," not in hosts:
        return False
    wanted = str(params.get("target_session_attrs") or os.environ.get("PGTARGETSESSIONATTRS", ""))
    return wanted not in WRITABLE_TARGETS


#: The bytes of application_name Postgres keeps (NAMEDATALEN - 1); it cuts longer ones.
APPLICATION_NAME_BYTES = 63


def session_name(head: str, tail: str = "") -> str:
    """An application_name the server keeps as given: printable ASCII only (Postgres rewrites
    other characters, to '?' or to escapes that lengthen it), at most 63 bytes, `head` cut to
    make room for `tail` (which must be printable ASCII and fit)."""
    clean = "".join(c if " " <= c <= "~" else "?" for c in head)
    return clean[: max(APPLICATION_NAME_BYTES - len(tail), 0)] + tail


def dsn_application_name(dsn: str) -> str | None:
    """The application_name the DSN itself sets, if any."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        value = conninfo_to_dict(dsn).get("application_name")
    except ProgrammingError:
        return None
    return str(value) if value not in (None, "") else None


# -- bounded waits --------------------------------------------------------------------------------

#: libpq's TCP settings every session of a sink or store gets unless its DSN sets them: a server
#: that stops answering at the TCP level (its host gone, a network partition dropping packets
#: without a reset) is noticed within about 30 s, whether the session is sending (data not
#: acknowledged for `tcp_user_timeout` ms) or waiting for an answer (keepalive probes after 10 s
#: idle, 4 of them 5 s apart, unanswered).
TCP_DEFAULTS: Mapping[str, str] = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "4",
    "tcp_user_timeout": "30000",
}
#: Seconds past the session's statement_timeout that a wait for the server may last before the
#: session is taken for lost: the server ends every statement by then, so a longer silence is a
#: connection that carries nothing (a proxy or middlebox that still acknowledges TCP but
#: forwards nothing, which no TCP setting notices).
ANSWER_GRACE_S = 10.0


def tcp_settings(dsn: str) -> dict[str, str]:
    """The TCP_DEFAULTS the DSN does not set (a DSN's own value, or a PG* variable's, wins)."""
    import os

    from psycopg.conninfo import conninfo_to_dict

    given = conninfo_to_dict(dsn)
    from_env = {"keepalives_idle": "PGKEEPALIVESIDLE", "tcp_user_timeout": "PGTCPUSERTIMEOUT"}
    return {
        key: value
        for key, value in TCP_DEFAULTS.items()
        if key not in given and not os.environ.get(from_env.get(key, ""), "")
    }


def bounded_connect(
    dsn: str,
    *,
    statement_timeout_s: float | None,
    lock_timeout_s: float | None,
    **kwargs: Any,
) -> psycopg.Connection[Any]:
    """A psycopg connection to `dsn` (psycopg.connect's `kwargs`) whose waits are bounded:
    TCP_DEFAULTS the DSN does not set; the session's statement_timeout and lock_timeout set
    when given (None: the server's, the role's or the DSN's `options` stay); and with a
    statement_timeout, a wait for the server longer than it plus ANSWER_GRACE_S closes the
    session and raises psycopg.OperationalError (a lost session, as `connection_lost` says;
    psycopg 3.3.6 or newer, which can bound a wait: with an older one, only the TCP settings
    bound it).
    Raises psycopg's errors as psycopg.connect does."""
    from psycopg import sql

    cls = _bounded_class()
    conn: psycopg.Connection[Any] = cls.connect(dsn, **{**tcp_settings(dsn), **kwargs})
    try:
        for name, seconds in (
            ("statement_timeout", statement_timeout_s),
            ("lock_timeout", lock_timeout_s),
        ):
            if seconds is not None:
                conn.execute(
                    sql.SQL("SET {} = {}").format(
                        sql.Identifier(name), sql.Literal(f"{math.ceil(seconds * 1000)}ms")
                    )
                )
        if not conn.autocommit:
            conn.commit()
    except BaseException:
        conn.close()
        raise
    if statement_timeout_s is not None:
        conn.wait_limit_s = statement_timeout_s + ANSWER_GRACE_S  # type: ignore[attr-defined]
    return conn


@cache
def _bounded_class() -> type[Any]:
    """psycopg.Connection with a bound on each wait for the server (made on first use: this
    module imports no database client at import)."""
    import inspect

    import psycopg
    from psycopg import errors

    # psycopg bounds a wait itself from 3.3.6 on (`timeout`, raising `_WaitTimeout`); with an
    # older psycopg only the TCP settings bound a wait.
    bounds = "timeout" in inspect.signature(psycopg.Connection.wait).parameters and hasattr(
        errors, "_WaitTimeout"
    )

    class BoundedConnection(psycopg.Connection[Any]):
        #: The longest a wait for the server may last (None: no bound).
        wait_limit_s: float | None = None

        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            if not bounds:
                return super().wait(gen, interval)
            limit = self.wait_limit_s if timeout is None else timeout
            try:
                return super().wait(gen, interval, limit)
            except errors._WaitTimeout:  # psycopg's own signal of its timeout
                if timeout is not None:
                    raise
                # The statement may still run on the server: the session cannot be reused.
                self.pgconn.finish()
                raise psycopg.OperationalError(
                    f"no answer from the server for {limit:g} s (statement_timeout + "
                    f"{ANSWER_GRACE_S:g} s): the session is taken for lost"
                ) from None

    return BoundedConnection


#: How a table durable-sinks creates records its layout's version: its comment,
#: `durable-sinks <format name>, version N`.
_LAYOUT_COMMENT = re.compile(r"^durable-sinks .*, version (\d+)$")


def layout_comment(layout: StoredFormat) -> str:
    """The comment of a table created with `layout`'s current version."""
    return f"durable-sinks {layout.name}, version {layout.current}"


def mark_layout(
    conn: psycopg.Connection[Any], table: psycopg.sql.Identifier, layout: StoredFormat
) -> None:
    """Record `layout`'s current version on `table` (just created by this connection: only
    its owner may comment on it)."""
    from psycopg import sql

    conn.execute(
        sql.SQL("COMMENT ON TABLE {} IS {}").format(table, sql.Literal(layout_comment(layout)))
    )


def check_layout(
    conn: psycopg.Connection[Any],
    table: psycopg.sql.Identifier,
    layout: StoredFormat,
    *,
    job: str | None = None,
    sink: str | None = None,
) -> int:
    """The layout version of the existing `table`, if this release reads it (StoredFormatError
    otherwise, core/formats.py). A table without a durable-sinks comment was created before
    layouts carried a version: version 1."""
    name = table.as_string(conn)
    row = conn.execute("SELECT obj_description(%s::regclass, 'pg_class')", (name,)).fetchone()
    comment = row[0] if row else None
    found = _LAYOUT_COMMENT.match(comment) if isinstance(comment, str) else None
    return layout.check(
        int(found[1]) if found else None, source=f"table {name}", job=job, sink=sink
    )
