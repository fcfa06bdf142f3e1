"""A job's settings for the `durable-sinks` command: the same options as `durable_sink(...)`,
from a TOML or JSON job file and/or flags, with secrets from the environment.

    # orders.toml: one sink (the options of durable_sink("postgres", ...))
    job_id = "orders"
    kind = "postgres"
    dsn = "${env:ORDERS_PG_DSN}"
    table = "events"

    # or several sinks (durable_sink([sink(...), sink(...)], ...))
    job_id = "orders"
    decision_store = "postgresql://ops@db/orders"
    [[sinks]]
    kind = "postgres"
    dsn = "${env:ORDERS_PG_DSN}"
    table = "events"
    [[sinks]]
    kind = "s3"
    path = "s3://lake/orders"

A secret reference in any string, `${env:NAME}` or `${file:/path}` as in a sink's options
(core/secrets.py), is replaced by what it names (ConfigError naming the reference, never a
value, when it cannot be read). Values never reach the command's output.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, as a package
    import tomli as tomllib

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.secrets import resolve
from durable_sinks.spark._options import JobOptions
from durable_sinks.spark._specs import SinkSpec, sink

#: `${NAME}` without `env:` or `file:`: not a reference (a job file's strings take the same
#: references as a sink's options).
_BARE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(value: Any, where: str = "the job file") -> Any:
    """`value` with every `${env:NAME}` and `${file:/path}` in its strings replaced by what it
    names; a bare `${NAME}` is a ConfigError naming the reference to write instead."""
    if isinstance(value, str):
        bare = _BARE.search(value)
        if bare is not None:
            raise ConfigError(
                f"{where}: {bare.group(0)} is not a reference: write ${{env:{bare.group(1)}}} "
                "(or ${file:/path}), as in a sink's options",
                fix=f"write ${{env:{bare.group(1)}}}",
            )
        return resolve(value, where)
    if isinstance(value, list):
        return [expand(v, where) for v in value]
    if isinstance(value, dict):
        return {k: expand(v, where) for k, v in value.items()}
    return value


def read_file(path: Path) -> dict[str, Any]:
    """The settings of a TOML (`.toml`) or JSON job file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the job file {path}: {exc.strerror}",
            fix="give the path of a TOML or JSON job file (docs/operations.md)",
        ) from None
    try:
        loaded = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"the job file {path} is not valid {'JSON' if path.suffix == '.json' else 'TOML'}: "
            f"{exc}",
            fix="fix the syntax at the position named",
        ) from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"the job file {path} must hold a table of settings", fix="see docs")
    return loaded


def parse_option(text: str) -> tuple[str, Any]:
    """`key=value` from a flag; the value is read as JSON when it parses (numbers, booleans,
    lists), else kept as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"option {text!r} is not key=value", fix="write e.g. -o table=events")
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


def job_settings(
    job_id: str,
    path: Path | None,
    kind: str | None,
    options: Sequence[str],
    store: str | None,
) -> tuple[list[SinkSpec], JobOptions]:
    """The job's sinks and options from the file, then the flags (which win)."""
    settings: dict[str, Any] = read_file(path) if path is not None else {}
    settings = expand(settings, str(path) if path else "the options")
    for text in options:
        key, value = parse_option(text)
        settings[key] = expand(value, f"option {key}")
    if kind is not None:
        settings["kind"] = kind
    if store is not None:
        settings["decision_store"] = expand(store, "--store")
    named = settings.setdefault("job_id", job_id)
    if named != job_id:
        raise ConfigError(
            f"the job file is for job {named!r}, not {job_id!r}",
            fix="give the job file of this job, or the job id it names",
        )
    return specs_of(settings)


def specs_of(settings: Mapping[str, Any]) -> tuple[list[SinkSpec], JobOptions]:
    """As `durable_sink` reads its arguments: one `kind` and its options, or `sinks`."""
    rest = dict(settings)
    listed = rest.pop("sinks", None)
    kind = rest.pop("kind", None)
    job, sink_options = JobOptions.split(rest)
    if listed is not None:
        if kind is not None or sink_options:
            raise ConfigError(
                f"with [[sinks]], settings {sorted(sink_options) or ['kind']} belong in a sink",
                job=job.job_id,
                fix="move each sink's options into its [[sinks]] table",
            )
        if not isinstance(listed, list) or not listed:
            raise ConfigError("`sinks` must be a list of tables", job=job.job_id, fix="[[sinks]]")
        specs = []
        for item in listed:
            options = dict(item)
            if "kind" not in options:
                raise ConfigError("a [[sinks]] table has no kind", job=job.job_id, fix="kind=")
            specs.append(sink(options.pop("kind"), **options))
        return specs, job
    if kind is None:
        raise ConfigError(
            "the job has no sink: give `kind` and its options, or [[sinks]] tables",
            job=job.job_id,
            fix="-f job.toml (docs/operations.md), or --kind postgres -o table=...",
        )
    return [SinkSpec(str(kind), sink_options)], job
