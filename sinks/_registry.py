"""Sinks built by name from a configuration mapping (after Feldera's DurableInputFactory).

Built-in sinks register here; third-party sinks register through the Python entry-point group
`durable_sinks.sinks`, each entry naming a callable `(config: Mapping) -> SinkConnector`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.protocol import SinkConnector

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
        raise ConfigError(
            f"no sink kind {kind!r}; known kinds: {', '.join(sorted(_factories)) or 'none'}",
            fix=f"use a known kind, or install the package that registers {kind!r} under the "
            f"entry-point group {ENTRY_POINT_GROUP!r}",
        )
    return factory(config)


def _load_entry_points() -> None:
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in _factories:
            register(entry.name, entry.load())


def _files(config: Mapping[str, Any]) -> SinkConnector:
    from .files import FileSink, FileSinkConfig

    try:
        return FileSink(FileSinkConfig(**config))
    except TypeError as exc:
        raise ConfigError(f"files sink: {exc}", fix="see FileSinkConfig for the options") from exc


def _postgres(config: Mapping[str, Any]) -> SinkConnector:
    from .postgres import PostgresSink, PostgresSinkConfig

    options = dict(config)
    if "key" in options and not isinstance(options["key"], tuple):
        options["key"] = (
            (options["key"],) if isinstance(options["key"], str) else tuple(options["key"])
        )
    try:
        return PostgresSink(PostgresSinkConfig(**options))
    except TypeError as exc:
        raise ConfigError(
            f"postgres sink: {exc}", fix="see PostgresSinkConfig for the options"
        ) from None


def _kafka(config: Mapping[str, Any]) -> SinkConnector:
    from .kafka import KafkaSink, KafkaSinkConfig

    options = dict(config)
    if "header_columns" in options and not isinstance(options["header_columns"], tuple):
        headers = options["header_columns"]
        options["header_columns"] = (headers,) if isinstance(headers, str) else tuple(headers)
    try:
        return KafkaSink(KafkaSinkConfig(**options))
    except TypeError as exc:
        raise ConfigError(f"kafka sink: {exc}", fix="see KafkaSinkConfig for the options") from None


register("files", _files)
register("kafka", _kafka)
register("postgres", _postgres)
