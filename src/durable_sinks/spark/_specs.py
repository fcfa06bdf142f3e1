"""Sinks as configuration: what a job is made of, picklable, built where it runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, overload

from durable_sinks import sinks
from durable_sinks.core import SinkConnector
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.kinds import SinkConfig

from ._options import job_option_names


@dataclass(frozen=True)
class SinkSpec:
    """One sink of a job: a registered kind and its configuration mapping.

    Building a spec checks the configuration (no server is contacted): a bad option raises
    ConfigError here, on the driver, before the query starts. `build()` makes a fresh,
    unopened sink (clients connect at `open`, wherever the sink runs).
    """

    kind: str
    config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", dict(self.config))
        self.build()  # validates kind and options now

    @classmethod
    def of(cls, config: object) -> SinkSpec | None:
        """The spec of a typed configuration (`Postgres(...)`, ...); None for anything else."""
        typed = sinks.typed_config(config)
        return None if typed is None else cls(*typed)

    def build(self) -> SinkConnector:
        return sinks.create(self.kind, self.config)

    @property
    def name(self) -> str:
        return str(self.config.get("name", self.kind))

    def __repr__(self) -> str:
        # Options may hold secrets (DSN passwords, SASL, keys): only the kind and name show.
        return f"SinkSpec({self.kind!r}, name={self.name!r})"


@overload
def sink(config: SinkConfig, /) -> SinkSpec: ...
@overload
def sink(kind: str, /, **config: Any) -> SinkSpec: ...
def sink(kind: SinkConfig | str, /, **config: Any) -> SinkSpec:
    """One sink of a multi-sink job: `durable_sink([sink("postgres", ...), sink("kafka", ...)],
    job_id=...)`. Options are those of the kind's config class (docs/guide.md). A typed
    configuration is a sink as it is (`durable_sink([Postgres(...), Kafka(...)], ...)`);
    `sink(Postgres(...))` is the same spec."""
    if not isinstance(kind, str):
        spec = SinkSpec.of(kind)
        if spec is None:
            raise ConfigError(
                f"a sink is a kind and its options or a typed configuration, not "
                f"{type(kind).__name__}",
                fix=f"sink('postgres', dsn=..., table=...) or Postgres(dsn=..., table=...); "
                f"kinds: {', '.join(sinks.kinds())}",
            )
        if config:
            raise ConfigError(
                f"options {sorted(config)} given beside a typed configuration "
                f"({type(kind).__name__})",
                fix=f"give them to {type(kind).__name__}(...)",
            )
        return spec
    job_options = sorted(set(config) & set(job_option_names()))
    if job_options:
        raise ConfigError(
            f"{job_options[0]} is a job option, not a {kind} sink's",
            fix=f"give it to durable_sink([...], {job_options[0]}=...)",
        )
    return SinkSpec(kind, config)
