"""A sink kind: the name a job writes (`durable_sink("postgres", ...)`), the configuration
dataclass that declares its options, and the function that builds a sink from a checked
configuration.

Every sink, built-in or third-party, is registered as a `SinkKind`; building one through it
gives every kind the same checks, in this order, before anything is created:

1. an option the configuration class does not declare is refused, naming the closest one
   it does (`tabel=` -> "did you mean 'table'?");
2. a required option (a field without a default) that is missing is refused;
3. a value of another type than the field declares is refused, naming both types (secret
   settings by type only);
4. the configuration class's own `__post_init__` checks values (ranges, combinations) and
   raises ConfigError;
5. `build(config)` makes the sink. It must not connect: clients are created lazily, where the
   sink runs (`open`, on the driver or an executor).

Before the checks, two conveniences apply by the declared types: a path object
(`pathlib.Path`) given for a `str` field becomes its string, and a string or a list given for a
`tuple[str, ...]` field becomes a tuple (`key="id"` -> `("id",)`).

A third-party package registers its kind under the entry-point group `durable_sinks.sinks`
(docs/writing-a-sink.md)::

    [project.entry-points."durable_sinks.sinks"]
    jsonl_archive = "my_package.sink:KIND"      # KIND = SinkKind("jsonl_archive", ...)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from .errors import ConfigError
from .protocol import SinkConnector
from .settings import check_settings, convenient, option_names, type_hints

ConfigT = TypeVar("ConfigT")


class SinkConfig(Protocol):
    """A sink's typed configuration: a frozen dataclass whose class names its registered
    kind (`kind`) and whose fields are the kind's options, `name` among them. Every built-in
    kind has one (`durable_sinks.Postgres`, `Kafka`, `S3`, `Delta`, `Iceberg`, `Files`,
    `Jsonl`); a plugin's may be one too, and is then a sink as it is
    (`durable_sink(MyConfig(...), job_id=...)`)."""

    kind: ClassVar[str]

    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class SinkKind(Generic[ConfigT]):
    """One kind of sink: `name` (what jobs write), `config_class` (a dataclass whose fields are
    the kind's options; picklable, as it travels to executors) and `build` (a configuration
    -> a sink; usually the sink class itself).

    `create(options)` is the one way a sink of this kind is made from a user's options: it
    runs the checks of this module's documentation and raises ConfigError, with nothing
    created, for the first option that is wrong."""

    name: str
    config_class: type[ConfigT]
    build: Callable[[ConfigT], SinkConnector]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(
                f"a sink kind's name must be a non-empty string, not {self.name!r}",
                fix="SinkKind('my_sink', MySinkConfig, MySink)",
            )
        config_class = self.config_class
        if not (isinstance(config_class, type) and dataclasses.is_dataclass(config_class)):
            raise ConfigError(
                f"sink kind {self.name!r}: config_class must be a dataclass, not "
                f"{self.config_class!r}",
                fix="declare the options as fields of a @dataclass(frozen=True) class",
            )
        if not callable(self.build):
            raise ConfigError(
                f"sink kind {self.name!r}: build must be callable (a config -> a sink), not "
                f"{type(self.build).__name__}",
                fix="pass the sink class, or a function taking the config and returning a sink",
            )

    def options(self) -> list[str]:
        """The option names, in declaration order."""
        return option_names(self.config_class)

    def configure(self, options: Mapping[str, Any]) -> ConfigT:
        """The checked configuration of `options` (ConfigError for the first wrong one)."""
        given = self._normalised(options)
        name = given.get("name", self.name)
        where = f"{self.name} sink {name!r}" if isinstance(name, str) else f"{self.name} sink"
        check_settings(self.config_class, given, where)
        return self.config_class(**given)

    def create(self, options: Mapping[str, Any]) -> SinkConnector:
        """A sink of this kind from a user's options, checked first (see `configure`)."""
        return self.build(self.configure(options))

    def _normalised(self, options: Mapping[str, Any]) -> dict[str, Any]:
        hints = type_hints(self.config_class)
        return {name: convenient(value, hints.get(name)) for name, value in options.items()}


@dataclass(frozen=True)
class Deferred:
    """A sink class named by its module, imported when a sink is first built: a sink package
    whose configuration must import without the sink's client (psycopg, confluent-kafka,
    boto3, deltalake) builds its kind with `SinkKind(name, Config, Deferred(module, name))`.
    Picklable, like the kind that holds it."""

    module: str
    name: str

    def __call__(self, config: Any) -> SinkConnector:
        sink_class: Callable[[Any], SinkConnector] = getattr(import_module(self.module), self.name)
        return sink_class(config)


def deferred_members(package: str, members: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports each of `members` (a name -> the
    module holding it, relative to `package`) when it is first asked for."""

    def member(name: str) -> Any:
        if name in members:
            return getattr(import_module(members[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return member
