"""Sink connectors: the targets durable-sinks writes to, one package per target (`built_in()`
lists the kinds, `package_of(kind)` their package: `durable_sinks.sinks.<target>`), each split
by role (configuration, error translation, the write path, the commit, recovery, operator
views, the protocol methods). `durable_sinks.sinks.folder` (the `files` and `jsonl` kinds) is
the reference sink: the template a sink author copies (docs/writing-a-sink.md).

A sink knows nothing of Spark or of the coordinator: it implements the protocol of
`durable_sinks.core` and nothing else. This package builds sinks by kind name
(`create("postgres", config)`; every kind is a `SinkKind`, built-in or installed through the
entry-point group `durable_sinks.sinks`); a sink's package is imported only when a sink of
its kind is built, so naming a kind loads no other sink's client library.
"""

from durable_sinks.core.kinds import SinkKind

from ._registry import (
    ENTRY_POINT_GROUP,
    SinkFactory,
    built_in,
    config_class_of,
    create,
    kind_of,
    kinds,
    options_of,
    package_of,
    register,
    typed_config,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "SinkFactory",
    "SinkKind",
    "built_in",
    "config_class_of",
    "create",
    "kind_of",
    "kinds",
    "options_of",
    "package_of",
    "register",
    "typed_config",
]
