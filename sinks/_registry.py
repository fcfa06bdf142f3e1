"""Sinks built by kind name from a configuration mapping (after Feldera's DurableInputFactory).

Every kind is a `SinkKind` (durable_sinks.core.kinds): its name, its configuration dataclass
and its build function; building through it checks the options the same way for every kind
(unknown names with the closest one, required options, types, then the class's own checks).
Kinds come from three places, looked up in this order:

- the built-in table below: one line per kind, naming the sink package that exports its
  `SinkKind` (`KIND`, or one per kind where a package holds several: `folder` holds `files`
  and `jsonl`); the package (and its client library) is imported only when a sink of that
  kind is asked for;
- `register(...)` at run time;
- installed distributions, through the entry-point group `durable_sinks.sinks`: each entry's
  name is the kind's name and its object a `SinkKind`. An entry naming a bare callable
  `(config: Mapping) -> SinkConnector` is still accepted and gets no option checking: the
  callable sees the options as the user gave them.

A plugin that cannot be loaded (its import fails, its object is neither a SinkKind nor
callable) is a ConfigError naming its distribution and entry point when its kind is asked
for; every other kind keeps working. A plugin cannot replace a built-in kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from importlib import import_module
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import Any

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.extras import needs_extra, require_extra
from durable_sinks.core.kinds import SinkKind
from durable_sinks.core.protocol import SinkConnector
from durable_sinks.core.settings import closest, settings_of

ENTRY_POINT_GROUP = "durable_sinks.sinks"
#: The bare-callable form of a kind: options in, sink out, no option checking.
SinkFactory = Callable[[Mapping[str, Any]], SinkConnector]

#: The built-in kinds: each one's package (relative to this package; it exports the kind's
#: `SinkKind`, see `_kind_in`) and the extra that installs its client (core/extras.py; None:
#: it needs none). Two kinds may share a package.
_BUILT_IN: dict[str, tuple[str, str | None]] = {
    "delta": (".delta", "delta"),
    "files": (".folder", None),
    "iceberg": (".iceberg", "iceberg"),
    "jsonl": (".folder", None),
    "kafka": (".kafka", "kafka"),
    "postgres": (".postgres", "postgres"),
    "s3": (".s3", "s3"),
}

_registered: dict[str, SinkKind[Any] | SinkFactory] = {}
#: Loaded entry points, by (distribution, name, object reference).
_loaded: dict[tuple[str, str, str], SinkKind[Any] | SinkFactory] = {}


def register(kind: SinkKind[Any] | str, factory: SinkFactory | None = None) -> None:
    """Make `create(name, config)` build sinks of `kind` (a SinkKind), or, in the bare form
    `register(name, factory)`, with `factory` and no option checking."""
    entry: SinkKind[Any] | SinkFactory
    if isinstance(kind, SinkKind):
        if factory is not None:
            raise ConfigError(
                f"register({kind.name!r}): a SinkKind carries its own build function",
                fix="register(kind) alone",
            )
        name, entry = kind.name, kind
    elif isinstance(kind, str) and factory is not None:
        name, entry = kind, factory
    else:
        raise ConfigError(
            f"register() takes a SinkKind, or a name and a factory, not {type(kind).__name__}",
            fix="register(SinkKind('my_sink', MySinkConfig, MySink))",
        )
    if name in _BUILT_IN or (name in _registered and _registered[name] is not entry):
        raise ConfigError(
            f"a sink kind named {name!r} is already registered", fix="give the kind another name"
        )
    _registered[name] = entry


def kinds() -> list[str]:
    """Every kind's name: built-in, registered and installed (a broken plugin's too: asking
    for it says what is wrong)."""
    return sorted({*_BUILT_IN, *_registered, *(e.name for e in _plugin_entries())})


def built_in() -> dict[str, str | None]:
    """The built-in kinds, each with the extra that installs its client (None: it needs
    none): the one list of them, which the package's exports, the extras check, the CLI and
    the docs' reference tables are derived from."""
    return {kind: extra for kind, (_, extra) in sorted(_BUILT_IN.items())}


def package_of(kind: str) -> str:
    """The package of a built-in kind (`durable_sinks.sinks.folder` for `files`), without
    importing it; KeyError for any other kind."""
    return f"{__package__}{_BUILT_IN[kind][0]}"


def create(kind: str, config: Mapping[str, Any]) -> SinkConnector:
    """Build a sink of `kind` from `config`, checked by the kind's configuration class (a
    bare-callable plugin checks its own)."""
    found = _resolve(kind)
    if isinstance(found, SinkKind):
        return found.create(config)
    return found(config)


def kind_of(kind: str) -> SinkKind[Any] | None:
    """The SinkKind named `kind`; None for a bare-callable plugin. ConfigError for a name
    no kind has (with the closest one) or a plugin that cannot be loaded."""
    found = _resolve(kind)
    return found if isinstance(found, SinkKind) else None


def typed_config(config: object) -> tuple[str, dict[str, Any]] | None:
    """The kind and settings of a typed configuration (`Postgres(...)`, `Kafka(...)`, ...:
    a dataclass instance whose class names its `kind`), as `create` takes them; None for
    anything else."""
    kind = getattr(type(config), "kind", None)
    if not isinstance(kind, str) or not dataclasses.is_dataclass(config):
        return None
    return kind, settings_of(config)


def config_class_of(kind: str) -> type[Any] | None:
    """The configuration dataclass of `kind`; None for a name no kind has and for a
    bare-callable plugin (only its factory knows its options). Imports that kind's package
    only."""
    if not isinstance(kind, str) or kind not in kinds():
        return None
    found = kind_of(kind)
    return found.config_class if found is not None else None


def options_of(kind: str) -> list[str] | None:
    """The option names of `kind` (None where config_class_of gives None)."""
    if not isinstance(kind, str) or kind not in kinds():
        return None
    found = kind_of(kind)
    return found.options() if found is not None else None


def _resolve(kind: str) -> SinkKind[Any] | SinkFactory:
    if isinstance(kind, str) and kind in _BUILT_IN:
        return _kind_in(_load(kind), kind)
    if isinstance(kind, str) and kind in _registered:
        return _registered[kind]
    entries = [e for e in _plugin_entries() if e.name == kind]
    if len(entries) > 1:
        raise ConfigError(
            f"sink kind {kind!r} is registered by several distributions: "
            f"{', '.join(_describe(e) for e in entries)}",
            fix="uninstall all but one of them",
        )
    if entries:
        return _load_plugin(entries[0])
    known = kinds()
    guess = closest(kind, known) if isinstance(kind, str) else None
    raise ConfigError(
        f"no sink kind {kind!r}; known kinds: {', '.join(known)}",
        fix=f"write {guess!r}"
        if guess
        else f"use a known kind, or install the package that registers {kind!r} under "
        f"the entry-point group {ENTRY_POINT_GROUP!r}",
    )


def _plugin_entries() -> list[EntryPoint]:
    """The group's entry points, but those naming a built-in kind (which cannot be replaced)."""
    return [e for e in entry_points(group=ENTRY_POINT_GROUP) if e.name not in _BUILT_IN]


def _distribution(entry: EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    return str(dist.name) if dist is not None else "an unknown distribution"


def _describe(entry: EntryPoint) -> str:
    return f"{_distribution(entry)} (entry point {entry.name} = {entry.value!r})"


def _load_plugin(entry: EntryPoint) -> SinkKind[Any] | SinkFactory:
    """The entry point's kind, loaded once; ConfigError naming the distribution and the
    entry point if it cannot be loaded or is not a kind."""
    key = (_distribution(entry), entry.name, entry.value)
    if key in _loaded:
        return _loaded[key]
    where = f"sink kind {entry.name!r} of {_describe(entry)} in group {ENTRY_POINT_GROUP!r}"
    try:
        loaded = entry.load()
    except Exception as exc:
        raise ConfigError(
            f"{where} cannot be loaded: {type(exc).__name__}: {exc}",
            fix=f"reinstall or fix {_distribution(entry)}, or uninstall it; other sink kinds "
            "are not affected",
        ) from exc
    if isinstance(loaded, SinkKind):
        if loaded.name != entry.name:
            raise ConfigError(
                f"{where} names a SinkKind called {loaded.name!r}",
                fix=f"name the entry point {loaded.name!r}, or the SinkKind {entry.name!r}",
            )
    elif not callable(loaded):
        raise ConfigError(
            f"{where} is a {type(loaded).__name__}, not a SinkKind",
            fix="point the entry point at a SinkKind(name, config_class, build) object "
            "(docs/writing-a-sink.md)",
        )
    found: SinkKind[Any] | SinkFactory = loaded
    _loaded[key] = found
    return found


def _load(kind: str) -> ModuleType:
    """A built-in kind's package, with its sink module and client: the one place a sink's
    client is first imported, so a missing client is a ConfigError naming the extra to install
    (`pip install 'durable-sinks[kafka]'`), whether the sink is asked for by `create`,
    `sink(...)`, `durable_sink(...)` (string or typed form) or the command line. The package
    alone (its configuration class) needs no client."""
    module, extra = _BUILT_IN[kind]
    if extra is None:
        import_module(f"{module}.sink", __package__)
        return import_module(module, __package__)
    what = f"the {kind} sink"
    require_extra(extra, what)
    with needs_extra(extra, what):
        import_module(f"{module}.sink", __package__)
    return import_module(module, __package__)


def _kind_in(package: ModuleType, kind: str) -> SinkKind[Any]:
    """The `SinkKind` named `kind` that a built-in package exports: its `KIND`, or one of
    several where the package holds several kinds (`folder`: `FILES` and `JSONL`)."""
    for value in vars(package).values():
        if isinstance(value, SinkKind) and value.name == kind:
            return value
    raise LookupError(f"{package.__name__} exports no SinkKind named {kind!r}")


def _where(kind: str, options: Mapping[str, Any]) -> str:
    name = options.get("name", kind)
    return f"{kind} sink {name!r}" if isinstance(name, str) else f"{kind} sink"
