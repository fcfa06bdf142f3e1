"""What a failed connection to Postgres means: the server is unreachable for now (retriable),
or it answered and refused the DSN (a configuration to fix). Shared by the Postgres sink and
the Postgres decision store, which hand it the first line of libpq's message; it loads no
database client (psycopg parses a DSN inside `connect_timeout` only)."""

from __future__ import annotations

from .errors import ConfigError, UnreachableError
from .redaction import redact

#: Phrases of libpq's (and the server's FATAL) messages when the server answered and refused
#: the connection's settings: retrying cannot help.
_REFUSED_SETTINGS = (
    ("authentication failed", "check the user and password (DSN, PGPASSWORD or ~/.pgpass)"),
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
