"""Sinks built by name from a configuration mapping (after Feldera's DurableInputFactory).

Built-in sinks register here; third-party sinks register through the Python entry-point group
`durable_sinks.sinks`, each entry naming a callable `(config: Mapping) -> SinkConnector`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from importlib import import_module
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.extras import needs_extra, require_extra
from durable_sinks.core.protocol import SinkConnector
from durable_sinks.core.settings import (
    check_settings,
    closest,
    current_names,
    option_names,
    settings_of,
)

ENTRY_POINT_GROUP = "durable_sinks.sinks"
SinkFactory = Callable[[Mapping[str, Any]], SinkConnector]
_factories: dict[str, SinkFactory] = {}


def register(kind: str, factory: SinkFactory) -> None:
    """Make `create(kind, config)` build sinks with `factory`."""
    if kind in _factories and _factories[kind] is not factory:
        raise ConfigError(f"a sink kind named {kind!r} is already registered")
    _factories[kind] = factory


def kinds() -> list[str]:
    _load_entry_points()
    return sorted(_factories)


def create(kind: str, config: Mapping[str, Any]) -> SinkConnector:
    """Build a sink of `kind` from `config` (validated by the sink's own config class)."""
    _load_entry_points()
    factory = _factories.get(kind)
    if factory is None:
        guess = closest(kind, _factories) if isinstance(kind, str) else None
        raise ConfigError(
            f"no sink kind {kind!r}; known kinds: {', '.join(sorted(_factories)) or 'none'}",
            fix=f"write {guess!r}"
            if guess
            else f"use a known kind, or install the package that registers {kind!r} under "
            f"the entry-point group {ENTRY_POINT_GROUP!r}",
        )
    _load(kind)
    return factory(current_options(kind, config, stacklevel=3))


def _load_entry_points() -> None:
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in _factories:
            register(entry.name, entry.load())


def current_options(kind: str, config: Mapping[str, Any], *, stacklevel: int = 3) -> dict[str, Any]:
    """`config` with the older spellings of `kind`'s options (core/settings.py RENAMED)
    rewritten to the current ones, each with a DeprecatedOptionWarning attributed to the
    frame `stacklevel` up from this function's (2: its caller)."""
    return current_names(kind, config, _where(kind, config), stacklevel=stacklevel + 1)


def typed_config(config: object) -> tuple[str, dict[str, Any]] | None:
    """The kind and settings of a typed configuration (`Postgres(...)`, `Kafka(...)`, ...:
    a dataclass instance whose class names its `kind`), as `create` takes them; None for
    anything else."""
    kind = getattr(type(config), "kind", None)
    if not isinstance(kind, str) or not dataclasses.is_dataclass(config):
        return None
    return kind, settings_of(config)


def config_class_of(kind: str) -> type[Any] | None:
    """The configuration dataclass of a built-in kind (None for a plugin's: only its factory
    knows its options). Imports that kind's package and checks its client is installed."""
    if kind not in _BUILT_IN:
        return None
    _, name, _ = _BUILT_IN[kind]
    config_class: type[Any] = getattr(_load(kind), name)
    return config_class


def options_of(kind: str) -> list[str] | None:
    """The option names of a built-in kind (None for a plugin's)."""
    config_class = config_class_of(kind)
    return option_names(config_class) if config_class is not None else None


#: Each built-in kind's package (relative to this package), configuration class and the extra
#: that installs its client (core/extras.py; None: it needs none).
_BUILT_IN: dict[str, tuple[str, str, str | None]] = {
    "delta": (".delta", "Delta", "delta"),
    "files": (".files", "Files", None),
    "kafka": (".kafka", "Kafka", "kafka"),
    "postgres": (".postgres", "Postgres", "postgres"),
    "s3": (".s3", "S3", "s3"),
}


def _load(kind: str) -> ModuleType | None:
    """A built-in kind's package, with its sink module and client (None for a plugin's
    kind): the one place a sink's client is first imported, so a missing client is a
    ConfigError naming the extra to install (`pip install 'durable-sinks[kafka]'`), whether
    the sink is asked for by `create`, `sink(...)`, `durable_sink(...)` (string or typed
    form) or the command line. The package alone (its configuration class) needs no client."""
    if kind not in _BUILT_IN:
        return None
    module, _, extra = _BUILT_IN[kind]
    if extra is None:
        import_module(f"{module}.sink", __package__)
        return import_module(module, __package__)
    what = f"the {kind} sink"
    require_extra(extra, what)
    with needs_extra(extra, what):
        import_module(f"{module}.sink", __package__)
    return import_module(module, __package__)


def _where(kind: str, options: Mapping[str, Any]) -> str:
    name = options.get("name", kind)
    return f"{kind} sink {name!r}" if isinstance(name, str) else f"{kind} sink"


def _checked(kind: str, config_class: type[Any], options: Mapping[str, Any]) -> None:
    """Names, required options and types, before the config class checks values."""
    check_settings(config_class, options, _where(kind, options))


def _as_tuple(options: dict[str, Any], name: str) -> None:
    """`key="id"` or `key=["a", "b"]` as the tuple the config class declares."""
    value = options.get(name)
    if isinstance(value, str):
        options[name] = (value,)
    elif isinstance(value, list):
        options[name] = tuple(value)


def _files(config: Mapping[str, Any]) -> SinkConnector:
    from .files import Files, FileSink

    options = dict(config)
    if isinstance(options.get("path"), os.PathLike):
        options["path"] = os.fspath(options["path"])
    _checked("files", Files, options)
    return FileSink(Files(**options))


def _postgres(config: Mapping[str, Any]) -> SinkConnector:
    from .postgres import Postgres, PostgresSink

    options = dict(config)
    _as_tuple(options, "key")
    _checked("postgres", Postgres, options)
    return PostgresSink(Postgres(**options))


def _kafka(config: Mapping[str, Any]) -> SinkConnector:
    from .kafka import Kafka, KafkaSink

    options = dict(config)
    _as_tuple(options, "header_columns")
    _checked("kafka", Kafka, options)
    return KafkaSink(Kafka(**options))


def _delta(config: Mapping[str, Any]) -> SinkConnector:
    from .delta import Delta, DeltaSink

    options = dict(config)
    if isinstance(options.get("path"), os.PathLike):
        options["path"] = os.fspath(options["path"])
    _as_tuple(options, "key")
    _as_tuple(options, "partition_by")
    _checked("delta", Delta, options)
    return DeltaSink(Delta(**options))


def _s3(config: Mapping[str, Any]) -> SinkConnector:
    from .s3 import S3, S3Sink

    options = dict(config)
    _checked("s3", S3, options)
    return S3Sink(S3(**options))


register("delta", _delta)
register("files", _files)
register("kafka", _kafka)
register("postgres", _postgres)
register("s3", _s3)
