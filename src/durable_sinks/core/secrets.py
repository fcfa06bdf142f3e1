"""Secrets kept out of the settings: `${env:NAME}` and `${file:/path}` references.

Any Kafka `producer_config` value, an S3 credential or a Postgres DSN may hold references
instead of the secret itself (the syntax of Kafka Connect's config providers)::

    producer_config={"sasl.password": "${env:KAFKA_PASSWORD}"}
    secret_access_key="${file:/run/secrets/s3-secret}"
    dsn="host=db dbname=app user=orders password=${file:/run/secrets/pg}"

A reference is resolved each time a client is made, where it is made (the driver, or an
executor in executor mode: the variable or file must exist there too), so the settings, their
reprs, pickles, decision records and logs hold the reference, never the value. A file's
trailing newline is dropped. `check` resolves every reference once when the settings are
built, so a missing variable or unreadable file is a ConfigError at `durable_sink(...)` time,
naming the reference, never a value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from .errors import ConfigError

REFERENCE = re.compile(r"\$\{(env|file):([^}]+)\}")

V = TypeVar("V")


def resolve(value: str, what: str) -> str:
    """`value` with every reference replaced by the secret it names; ConfigError naming
    `what` (e.g. "kafka sink 'k': producer_config['sasl.password']") and the reference when
    one cannot be resolved."""

    def secret(found: re.Match[str]) -> str:
        kind, name = found.group(1), found.group(2)
        if kind == "env":
            if name not in os.environ:
                raise ConfigError(
                    f"{what}: environment variable {name} (named by ${{env:{name}}}) is not set",
                    fix=f"set {name} where the job runs (the driver, and the executors in "
                    "executor mode), or give the setting another way",
                )
            return os.environ[name]
        try:
            return Path(name).read_text(encoding="utf-8").removesuffix("\n")
        except OSError as exc:
            raise ConfigError(
                f"{what}: cannot read the secret file {name} (named by ${{file:{name}}}): "
                f"{exc.strerror or type(exc).__name__}",
                fix="make the file readable by the job's user where the job runs (the "
                "driver, and the executors in executor mode)",
            ) from None

    return REFERENCE.sub(secret, value)


def resolve_settings(settings: Mapping[str, V], what: str) -> dict[str, V | str]:
    """`settings` with the references in its string values resolved."""
    return {
        key: resolve(value, f"{what}[{key!r}]") if isinstance(value, str) else value
        for key, value in settings.items()
    }


def check(value: str | None, what: str) -> None:
    """Resolve `value`'s references once (and forget the result): raises the ConfigError
    `resolve` would, when the settings are built rather than at the first connection."""
    if value is not None and REFERENCE.search(value):
        resolve(value, what)
