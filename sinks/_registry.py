"""Sinks built by name from a configuration mapping (after Feldera's DurableInputFactory).

Built-in sinks register here; third-party sinks register through the Python entry-point group
`durable_sinks.sinks`, each entry naming a callable `(config: Mapping) -> SinkConnector`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from importlib import import_module
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.extras import needs_extra, require_extra
from durable_sinks.core.protocol import SinkConnector
from durable_sinks.core.settings import check_settings, closest, option_names

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
    return factory(config)


def _load_entry_points() -> None:
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in _factories:
            register(entry.name, entry.load())


def config_class_of(kind: str) -> type[Any] | None:
    """The configuration dataclass of a built-in kind (None for a plugin's: only its factory
    knows its options). Imports that kind's package only."""
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
    "delta": (".delta", "DeltaSinkConfig", "delta"),
    "files": (".files", "FileSinkConfig", None),
    "kafka": (".kafka", "KafkaSinkConfig", "kafka"),
    "postgres": (".postgres", "PostgresSinkConfig", "postgres"),
    "s3": (".s3", "S3SinkConfig", "s3"),
}


def _load(kind: str) -> ModuleType | None:
    """A built-in kind's package, imported with its client (None for a plugin's kind): the
    one place a sink's package is first imported, so a missing client is a ConfigError naming
    the extra to install (`pip install 'durable-sinks[kafka]'`), whether the sink is asked
    for by `create`, `sink(...)`, `durable_sink(...)` or the command line."""
    if kind not in _BUILT_IN:
        return None
    module, _, extra = _BUILT_IN[kind]
    if extra is None:
        return import_module(module, __package__)
    what = f"the {kind} sink"
    require_extra(extra, what)
    with needs_extra(extra, what):
        return import_module(module, __package__)


def _checked(kind: str, config_class: type[Any], options: Mapping[str, Any]) -> None:
    """Names, required options and types, before the config class checks values."""
    name = options.get("name", kind)
    where = f"{kind} sink {name!r}" if isinstance(name, str) else f"{kind} sink"
    check_settings(config_class, options, where)


def _as_tuple(options: dict[str, Any], name: str) -> None:
    """`key="id"` or `key=["a", "b"]` as the tuple the config class declares."""
    value = options.get(name)
    if isinstance(value, str):
        options[name] = (value,)
    elif isinstance(value, list):
        options[name] = tuple(value)


def _files(config: Mapping[str, Any]) -> SinkConnector:
    from .files import FileSink, FileSinkConfig

    options = dict(config)
    if isinstance(options.get("path"), os.PathLike):
        options["path"] = os.fspath(options["path"])
    _checked("files", FileSinkConfig, options)
    return FileSink(FileSinkConfig(**options))


def _postgres(config: Mapping[str, Any]) -> SinkConnector:
    from .postgres import PostgresSink, PostgresSinkConfig

    options = dict(config)
    _as_tuple(options, "key")
    _checked("postgres", PostgresSinkConfig, options)
    return PostgresSink(PostgresSinkConfig(**options))


def _kafka(config: Mapping[str, Any]) -> SinkConnector:
    from .kafka import KafkaSink, KafkaSinkConfig

    options = dict(config)
    _as_tuple(options, "header_columns")
    _checked("kafka", KafkaSinkConfig, options)
    return KafkaSink(KafkaSinkConfig(**options))


def _delta(config: Mapping[str, Any]) -> SinkConnector:
    from .delta import DeltaSink, DeltaSinkConfig

    options = dict(config)
    if isinstance(options.get("path"), os.PathLike):
        options["path"] = os.fspath(options["path"])
    _as_tuple(options, "key")
    _as_tuple(options, "partition_by")
    _checked("delta", DeltaSinkConfig, options)
    return DeltaSink(DeltaSinkConfig(**options))


def _s3(config: Mapping[str, Any]) -> SinkConnector:
    from .s3 import S3Sink, S3SinkConfig

    options = dict(config)
    _checked("s3", S3SinkConfig, options)
    return S3Sink(S3SinkConfig(**options))


register("delta", _delta)
register("files", _files)
register("kafka", _kafka)
register("postgres", _postgres)
register("s3", _s3)
