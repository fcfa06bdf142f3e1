"""Hiding secrets: the one function every message, repr, log line and metric goes through.

`redact(dsn)` gives a libpq connection string or URI without its passwords; `redact(settings)`
gives a client's settings (librdkafka, boto3) with every secret-looking value replaced by
`***`. Neither ever raises on odd input: a DSN it cannot parse is shown as
`<unparseable DSN>`, never as itself, and without psycopg (which parses DSNs; the `postgres`
extra) no DSN is shown at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar, overload

#: Setting names holding one of these words are secrets (`sasl.password`,
#: `ssl.key.password`, `aws_secret_access_key`, `sasl.oauthbearer.config` tokens, ...).
SECRET_WORDS = ("password", "secret", "key", "token", "jaas", "credential")
#: libpq parameters that hold a password.
_DSN_SECRETS = ("password", "sslpassword")
MASK = "***"

V = TypeVar("V")


def is_secret(setting: str) -> bool:
    """True when a setting's name says its value is a secret."""
    return any(word in setting.lower() for word in SECRET_WORDS)


@overload
def redact(value: str) -> str: ...


@overload
def redact(value: Mapping[str, V]) -> dict[str, V | str]: ...


def redact(value: str | Mapping[str, V]) -> str | dict[str, V | str]:
    """`value` with its secrets hidden: a DSN without passwords, or settings with secret
    values replaced by `***`."""
    if isinstance(value, str):
        return _redact_dsn(value)
    return {k: (MASK if is_secret(k) else v) for k, v in value.items()}


#: A DSN shown where psycopg, which reads it, is not installed (the `postgres` extra).
UNREAD_DSN = "<a DSN, hidden: psycopg is not installed to read it>"


def _redact_dsn(dsn: str) -> str:
    # psycopg parses both forms exactly as libpq does (a hand-written parser could miss a
    # password); imported here so that the foundation loads no database driver. Without it
    # (an install without the `postgres` extra) nothing of the DSN is shown.
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict, make_conninfo
    except ImportError:
        return UNREAD_DSN

    try:
        params = conninfo_to_dict(dsn)
    except ProgrammingError:
        return "<unparseable DSN>"
    for secret in _DSN_SECRETS:
        params.pop(secret, None)
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})
