"""Choosing a decision store from what a user writes in a job's options.

Accepted: a DecisionStore; a Postgres DSN (`postgresql://...`, `postgres://...`, or a libpq
`key=value ...` string); an S3 location `s3://bucket/prefix` (or `s3a://`; the server and
credentials from boto3's default chain: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...); an absolute
directory path (str or os.PathLike), or the same as a `file:///absolute/path` URI. Everything
else is a ConfigError naming the mistake, raised before anything is created: a relative path
in particular (it would be resolved against the current directory, and a driver restarted
from another one would find no decisions: recovery breaks), any other URI scheme (a typo such
as `postgresq://` would otherwise become a folder), and a `key=value` string libpq cannot
parse.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from typing import Any, NoReturn
from urllib.parse import unquote, urlsplit

from durable_sinks.clients.postgres import SEVERAL_SERVERS_FIX, may_reach_a_standby, server_of
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.extras import require_extra

from ._file_store import LocalDirectoryStore
from ._store import DecisionStore

_LIBPQ_KEYWORD = re.compile(r"(^|\s)(host|hostaddr|dbname|user|port|service)\s*=")
#: Something that means to be a libpq keyword string: it starts with `word=`.
_KEYWORD_STRING = re.compile(r"^\s*[A-Za-z_][A-Za-z0-9_]*\s*=")
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: The URI schemes a decision store may be given with.
SCHEMES = ("postgresql", "postgres", "s3", "s3a", "file")
_PASSWORD_IN_URI = re.compile(r"(://[^:/@?#]*):[^@/?#]*@")
_EXAMPLES = (
    "decision_store='/durable/volume/my-job', decision_store='postgresql://...' or "
    "decision_store='s3://bucket/prefix'"
)


def is_postgres_dsn(text: str) -> bool:
    """True for a postgresql:// URI or a libpq `key=value` connection string."""
    return text.startswith(("postgresql://", "postgres://")) or bool(_LIBPQ_KEYWORD.search(text))


def store_from(
    target: str | os.PathLike[str] | DecisionStore, *, job: str | None = None
) -> DecisionStore:
    """A decision store from `target` (see the module docs for what is accepted): a store
    as is, a Postgres DSN (table in `public`), an S3 location, or an absolute path of a local
    directory (on storage that survives the machine: fsync and link must work there).
    ConfigError, with nothing created, for anything else."""
    if isinstance(target, DecisionStore):
        return target
    if isinstance(target, os.PathLike):
        path = os.fspath(target)
        if not isinstance(path, str):
            raise _refused(f"decision_store {path!r} is a bytes path", _EXAMPLES, job)
        return _directory(path, job)
    if not isinstance(target, str):
        raise _refused(
            f"decision_store must be a directory path, a Postgres DSN, an s3:// location or a "
            f"DecisionStore, not "
            f"{type(target).__name__}",
            _EXAMPLES,
            job,
        )
    text = target.strip()
    if not text:
        raise _refused("decision_store is empty", _EXAMPLES, job)
    uri = _URI.match(text)
    if uri is not None:
        scheme = uri.group(1)
        if scheme.lower() in ("postgresql", "postgres"):
            require_extra("postgres", _POSTGRES_STORE, job=job)
            _check_dsn(text, job)
            return _postgres(target)
        if scheme.lower() == "file":
            return _directory(_file_uri_path(text, job), job)
        if scheme.lower() in ("s3", "s3a"):
            require_extra("s3", _S3_STORE, job=job)
            return _s3(text, job)
        return _unknown_scheme(text, scheme, job)
    if is_postgres_dsn(text) or _KEYWORD_STRING.match(text):
        require_extra("postgres", _POSTGRES_STORE, job=job)
        _check_dsn(text, job)
        return _postgres(target)
    return _directory(text, job)


def _postgres(dsn: str) -> DecisionStore:
    from .postgres import PostgresDecisionStore

    return PostgresDecisionStore(dsn)


#: What the stores are called when their client is missing (require_extra: a ConfigError
#: naming the extra to install, before anything is created).
_POSTGRES_STORE = "a Postgres decision store"
_S3_STORE = "an S3 decision store"


def _s3(uri: str, job: str | None) -> DecisionStore:
    """An S3DecisionStore at `uri` (parsed now: a bad bucket or prefix is a ConfigError before
    anything connects); the connection from boto3's default chain."""
    from durable_sinks.clients.s3 import S3Location

    from .s3 import S3DecisionStore

    try:
        location = S3Location.parse(uri, what="decision_store")
    except ConfigError as exc:
        raise _refused(exc.message, exc.fix or _EXAMPLES, job) from None
    return S3DecisionStore(location)


def _refused(message: str, fix: str, job: str | None) -> ConfigError:
    return ConfigError(message, job=job, fix=fix)


def _directory(path: str, job: str | None) -> DecisionStore:
    """A LocalDirectoryStore at an absolute `path`; a relative one is refused."""
    if path.startswith("~"):
        raise _refused(
            f"decision_store {path!r} starts with '~', which is not expanded: it would become "
            "a folder named '~' under the current directory",
            f"decision_store={os.path.expanduser(path)!r} (an absolute path)",
            job,
        )
    if not os.path.isabs(path):
        raise _refused(
            f"decision_store {path!r} is a relative path: it depends on the current directory "
            f"({os.getcwd()}), so a driver restarted from another directory would find none of "
            "the decisions recorded here and recovery would break",
            f"decision_store={os.path.abspath(path)!r} (an absolute path on storage that "
            "survives the machine)",
            job,
        )
    return LocalDirectoryStore(path)


def _file_uri_path(text: str, job: str | None) -> str:
    """The path of a `file:///absolute/path` URI (a host other than localhost refused)."""
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise _refused(
            f"decision_store {text!r} is not a file:///absolute/path URI (a file URI names "
            "a host between '//' and the path; this one names "
            f"{parts.netloc!r})",
            f"decision_store='file:///{parts.netloc}{parts.path}' or the plain absolute path "
            f"'/{parts.netloc}{parts.path}'",
            job,
        )
    return unquote(parts.path)


def _unknown_scheme(text: str, scheme: str, job: str | None) -> NoReturn:
    shown = _PASSWORD_IN_URI.sub(r"\1:***@", text)
    close = difflib.get_close_matches(scheme.lower(), SCHEMES, n=1, cutoff=0.6)
    known = ", ".join(f"{s}://" for s in SCHEMES)
    if close:
        hint = f"did you mean {close[0]}://?"
        fix = f"decision_store={close[0] + shown[len(scheme) :]!r}"
    else:
        hint = f"the schemes a decision store accepts are {known}"
        fix = f"{_EXAMPLES} (or a DecisionStore object)"
    raise _refused(
        f"decision_store {shown!r} has the URI scheme {scheme + '://'!r}, which no decision "
        f"store uses ({hint}); it is not taken for a folder",
        fix,
        job,
    )


def _check_dsn(text: str, job: str | None) -> None:
    """A connection string libpq cannot parse (a misspelt keyword: `hots=`) is refused
    here, with libpq's reason, instead of failing later as a driver error."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(text)
    except ProgrammingError as exc:
        lines = str(exc).strip().splitlines()
        reason = lines[0] if lines else type(exc).__name__
        if "password" in text.lower() or _PASSWORD_IN_URI.search(text):
            reason = re.sub(r'"[^"]*"', '"***"', reason)  # a fragment could be a password
        raise _refused(
            f"decision_store looks like a Postgres connection string, but libpq cannot read "
            f"it: {reason}",
            "correct it: 'host=... port=5432 dbname=... user=...' or 'postgresql://user@host/db' "
            "(libpq's keywords: host, port, dbname, user, password, sslmode, ...); a directory "
            "must be an absolute path",
            job,
        ) from None
    if may_reach_a_standby(params):
        raise _refused(
            f"decision_store names several Postgres servers ({server_of(text)}) without "
            "target_session_attrs=read-write: libpq could connect to a standby",
            SEVERAL_SERVERS_FIX,
            job,
        )


def default_store_for(kind: str, config: Mapping[str, Any]) -> DecisionStore | None:
    """The store a job may use when it names none: one next to a sink that can host it (a
    Postgres sink's database, in the sink's meta schema; an S3 sink's prefix, under
    `_decisions`; a Delta table's folder, under `_decisions`, which Delta's readers and VACUUM
    skip: a local folder as a LocalDirectoryStore, an S3 prefix as an S3DecisionStore). None
    when `kind` cannot. (A Kafka sink keeps a job's decisions in its own commits instead: see
    HostedDecisionStore; it is asked for only when Kafka is the job's only sink.)"""
    if kind == "s3":
        return _s3_beside(config)
    if kind == "delta":
        return _delta_beside(config)
    if kind != "postgres" or not isinstance(config.get("dsn"), str):
        return None
    require_extra("postgres", _POSTGRES_STORE)
    from .postgres import PostgresDecisionStore

    table = str(config.get("table", ""))
    schema = config.get("meta_schema") or (table.split(".")[0] if "." in table else "public")
    # Its errors say where it lives: the user never named this store.
    name = str(config.get("name", kind))
    timeout = config.get("connect_timeout_s")
    return PostgresDecisionStore(
        config["dsn"],
        schema=str(schema),
        connect_timeout_s=timeout
        if isinstance(timeout, int | float) and not isinstance(timeout, bool)
        else None,
        where=f"the job's decision store, in the database of postgres sink {name!r}",
    )


#: The S3 sink's settings that say how to reach the server (sinks/s3/config.py; a decision
#: store never imports a sink, so they are read from the sink's config mapping by name).
_S3_CONNECTION_KEYS = (
    "endpoint_url",
    "ca_bundle",
    "region",
    "access_key_id",
    "secret_access_key",
    "session_token",
    "addressing_style",
    "connect_timeout_s",
    "request_timeout_s",
    "request_attempts",
)


def _delta_beside(config: Mapping[str, Any]) -> DecisionStore | None:
    """The store under `<path>/_decisions` of a Delta table's folder: a LocalDirectoryStore
    for a local table (`/data/events`, `file:///data/events`), an S3DecisionStore reached as
    the sink reaches S3 for `s3://` (or `s3a://`). None without a path (the sink's own
    configuration refuses it)."""
    path = config.get("path")
    if not isinstance(path, str) or not path:
        return None
    if path.startswith(("s3://", "s3a://")):
        return _s3_beside({**config, "path": path.replace("s3a://", "s3://", 1)}, kind="delta")
    folder = _file_uri_path(path, None) if path.startswith("file:") else path
    if not os.path.isabs(folder):
        return None  # the Delta sink's configuration refuses it, naming the fix
    return LocalDirectoryStore(os.path.join(folder, "_decisions"))


def _s3_beside(config: Mapping[str, Any], *, kind: str = "s3") -> DecisionStore | None:
    """An S3DecisionStore under `<path>/_decisions` of an S3 (or Delta) sink, reached as the
    sink is (its settings, else boto3's chain). None without a path."""
    from durable_sinks.clients.s3 import S3Connection, S3Location

    path = config.get("path")
    if not isinstance(path, str):
        return None
    require_extra("s3", _S3_STORE)
    from .s3 import S3DecisionStore

    name = str(config.get("name", kind))
    location = S3Location.parse(path, what=f"{kind} sink {name!r}: path").child("_decisions")
    settings = {k: config[k] for k in _S3_CONNECTION_KEYS if config.get(k) is not None}
    for timeout in ("connect_timeout_s", "request_timeout_s"):
        if timeout in settings:
            try:
                settings[timeout] = float(settings[timeout])
            except (TypeError, ValueError):
                raise ConfigError(
                    f"{kind} sink {name!r}: {timeout} {settings[timeout]!r} is not a number of "
                    "seconds",
                    fix=f"{timeout}=10",
                ) from None
    if "request_attempts" in settings:
        try:
            settings["request_attempts"] = int(settings["request_attempts"])
        except (TypeError, ValueError):
            raise ConfigError(
                f"{kind} sink {name!r}: request_attempts {settings['request_attempts']!r} is "
                "not a whole number",
                fix="request_attempts=4",
            ) from None
    return S3DecisionStore(
        location,
        S3Connection(**settings),
        where=f"the job's decision store, under {location} of {kind} sink {name!r}",
    )
