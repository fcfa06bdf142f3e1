"""Checking settings against the dataclass that declares them, before anything is built.

A configuration class (Postgres, Kafka, JobOptions, ...) declares each
setting's type in its annotations. `check_settings` compares what a user passed with them and
raises one ConfigError naming the setting, the type given and the type wanted, or, for a name
the class does not have, the closest one it has (`tabel=` -> "did you mean 'table'?").
`from_strings` reads Spark's string options (`.option("create_table", "true")`) as the
declared types.

Values of settings whose name marks them secret (`dsn`, `producer_config`, passwords) are
never shown, only their type.

One idea has one name and one unit everywhere: durations are seconds (a number, names ending
in `_s`), sizes bytes (names ending in `_bytes`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import os
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from .errors import ConfigError
from .redaction import is_secret

#: Settings whose values are never shown in a message (besides names `is_secret` flags).
SECRET_SETTINGS = frozenset({"dsn", "producer_config", "decision_store"})


def settings_of(config: Any) -> dict[str, Any]:
    """A configuration object's settings as the mapping its string form takes: every
    required field and every field that differs from its default."""
    settings: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        if not f.init:
            continue
        value = getattr(config, f.name)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            settings[f.name] = value
            continue
        if value != default:
            settings[f.name] = value
    return settings


def without_none(annotation: Any) -> Any:
    """`X | None` -> X; anything else as it is."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def convenient(value: Any, annotation: Any) -> Any:
    """`value` with the conveniences every option has by its declared type: a path object
    (`pathlib.Path`) given for a `str` option becomes its string, and a string or a list
    given for a `tuple[str, ...]` option becomes a tuple (`key="id"` -> `("id",)`). Anything
    else is returned as it is (the type checks then judge it)."""
    wanted = without_none(annotation)
    if wanted is str and isinstance(value, os.PathLike):
        path = os.fspath(value)
        return path if isinstance(path, str) else value
    if typing.get_origin(wanted) is tuple and typing.get_args(wanted)[1:] == (...,):
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list):
            return tuple(value)
    return value


_TYPE_HINTS: dict[type[Any], dict[str, Any]] = {}


def type_hints(cls: type[Any]) -> dict[str, Any]:
    """The resolved annotations of a (configuration or details) dataclass, once per class:
    they never change, and configurations are built and checked per sink and per task, and
    details parsed per handle. The mapping is shared: read it, never change it. (A dict, not
    functools.cache: mypy does not take a class for the cache's Hashable argument.)"""
    if cls not in _TYPE_HINTS:
        _TYPE_HINTS[cls] = typing.get_type_hints(cls)
    return _TYPE_HINTS[cls]


def apply_conveniences(config: Any) -> None:
    """`convenient` applied to every option of a frozen configuration dataclass, first thing
    in its `__post_init__`: a configuration built directly (`Delta(key="order_id")`) gets
    what the string form (`durable_sink("delta", key="order_id")`) gets."""
    hints = type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        changed = convenient(value, hints.get(f.name))
        if changed is not value:
            object.__setattr__(config, f.name, changed)


def option_names(cls: type[Any]) -> list[str]:
    """The settings a configuration dataclass declares, in declaration order."""
    return [f.name for f in dataclasses.fields(cls) if f.init]


def required_names(cls: type[Any]) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate `name` most likely misspells, if any is close enough."""
    folded = {c.lower().replace("-", "_"): c for c in candidates}
    found = difflib.get_close_matches(name.lower().replace("-", "_"), folded, n=1, cutoff=0.6)
    return folded[found[0]] if found else None


def unknown_option(
    name: str, where: str, valid: Iterable[str], *, job: str | None = None
) -> ConfigError:
    """The error for a setting `where` does not have, naming the closest valid one."""
    valid = sorted(valid)
    guess = closest(name, valid)
    hint = f"; did you mean {guess!r}?" if guess else ""
    return ConfigError(
        f"{where}: unknown option {name!r}{hint}",
        job=job,
        fix=f"write {guess}=..." if guess else f"use one of: {', '.join(valid)}",
    )


def check_settings(
    cls: type[Any], options: Mapping[str, Any], where: str, *, job: str | None = None
) -> None:
    """Raise ConfigError for the first setting in `options` that `cls` does not declare, for
    a missing required one, or for a value of the wrong type."""
    names = option_names(cls)
    for name in options:
        if name not in names:
            raise unknown_option(name, where, names, job=job)
    missing = [n for n in required_names(cls) if n not in options]
    if missing:
        raise ConfigError(
            f"{where}: missing required option {missing[0]!r}",
            job=job,
            fix=f"give {', '.join(f'{n}=...' for n in missing)}",
        )
    check_types(cls, options, where, job=job)


def check_types(
    cls: type[Any], options: Mapping[str, Any], where: str, *, job: str | None = None
) -> None:
    """Raise ConfigError for the first value in `options` of another type than `cls`
    declares (for a mapping, naming the entry); names `cls` does not declare pass."""
    hints = type_hints(cls)
    for name, value in options.items():
        wanted = hints.get(name)
        if wanted is None or matches(value, wanted):
            continue
        if isinstance(value, Mapping) and typing.get_origin(wanted) in (Mapping, dict):
            key_type, item_type = typing.get_args(wanted) or (Any, Any)
            for key, item in value.items():
                if not matches(key, key_type):
                    raise wrong_type(f"the keys of {name}", key, key_type, where, job=job)
                if not matches(item, item_type):
                    raise wrong_type(f"{name}[{key!r}]", item, item_type, where, job=job)
        raise wrong_type(name, value, wanted, where, job=job)


def wrong_type(
    name: str, value: Any, wanted: Any, where: str, *, job: str | None = None
) -> ConfigError:
    shown = "" if _is_secret(name) else f" {_short(value)}"
    example = _example(wanted)
    return ConfigError(
        f"{where}: {name} must be {describe(wanted)}, not {type(value).__name__}{shown}",
        job=job,
        fix=f"write {name}={example}" if example else f"give {name} as {describe(wanted)}",
    )


def matches(value: Any, wanted: Any) -> bool:
    """Whether `value` is acceptable for the annotation `wanted` (bool is not an int here,
    an int is a float, a list is a tuple, an enum accepts its values)."""
    if wanted is Any:
        return True
    origin = typing.get_origin(wanted)
    args = typing.get_args(wanted)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, arg) for arg in args)
    if origin is Literal:
        return any(type(value) is type(arg) and value == arg for arg in args)
    if wanted is type(None):
        return value is None
    if wanted is bool:
        return isinstance(value, bool)
    if wanted is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if wanted is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(wanted, type) and issubclass(wanted, enum.Enum):
        return isinstance(value, wanted) or value in {m.value for m in wanted}
    if origin is tuple:
        if not isinstance(value, tuple | list):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(matches(v, args[0]) for v in value)
        return len(value) == len(args) and all(
            matches(v, a) for v, a in zip(value, args, strict=True)
        )
    if origin in (Mapping, dict, typing.Mapping):
        if not isinstance(value, Mapping):
            return False
        key, item = args or (Any, Any)
        return all(matches(k, key) and matches(v, item) for k, v in value.items())
    if origin is os.PathLike:
        return isinstance(value, os.PathLike)
    if isinstance(wanted, type):
        return isinstance(value, wanted)
    return True  # an annotation this checker does not model: the class checks it


def describe(wanted: Any) -> str:
    """An annotation in words: "an integer", "True or False", "a string or None", ..."""
    origin = typing.get_origin(wanted)
    args = typing.get_args(wanted)
    if origin in (typing.Union, types.UnionType):
        described = [describe(a) for a in args if a is not type(None)]
        if type(None) in args:
            described.append("None")
        return " or ".join(dict.fromkeys(described))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple:
        return f"a list or tuple of {_plural(describe(args[0]))}" if args else "a tuple"
    if origin in (Mapping, dict, typing.Mapping):
        return "a dict of settings"
    if origin is os.PathLike:
        return "a path"
    if isinstance(wanted, type) and issubclass(wanted, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in wanted)
    words = {
        bool: "True or False",
        int: "an integer",
        float: "a number",
        str: "a string",
        type(None): "None",
    }
    if wanted in words:
        return words[wanted]
    return f"a {getattr(wanted, '__name__', str(wanted))}"


def from_strings(cls: type[Any], options: Mapping[str, str]) -> dict[str, Any]:
    """Spark's string options read as the types `cls` declares ("true" -> True, "30" -> 30,
    "2.5" -> 2.5, "a,b" or '["a","b"]' -> a tuple); a string that does not read as its type
    stays a string (check_settings then names it). Names `cls` does not declare stay as
    they are."""
    import json

    hints = typing.get_type_hints(cls)
    read: dict[str, Any] = {}
    for name, text in options.items():
        wanted = hints.get(name)
        read[name] = text if wanted is None else _read(text, wanted, json)
    return read


def _read(text: str, wanted: Any, json: Any) -> Any:
    if matches(text, wanted):
        return text
    candidates: list[Any] = []
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        candidates.append(lowered == "true")
    if lowered in ("none", "null"):
        candidates.append(None)
    for convert in (int, float):
        with contextlib.suppress(ValueError):
            candidates.append(convert(text))
    if text.strip()[:1] in "[{":
        with contextlib.suppress(ValueError):
            candidates.append(json.loads(text))
    candidates.append(tuple(p.strip() for p in text.split(",") if p.strip()))
    for candidate in candidates:
        if matches(candidate, wanted):
            return candidate
    return text


def _example(wanted: Any) -> str | None:
    origin = typing.get_origin(wanted)
    args = [a for a in typing.get_args(wanted) if a is not type(None)]
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _example(args[0])
    if wanted is bool:
        return "True (a Python bool, not a string)"
    if wanted is int:
        return "10 (a Python int, not a string)"
    if wanted is float:
        return "30.0 (a number, not a string)"
    if wanted is str:
        return "'...' (a string)"
    if origin is Literal:
        return repr(typing.get_args(wanted)[0])
    if origin is tuple:
        return "('a', 'b')"
    return None


def _plural(text: str) -> str:
    for article in ("an ", "a "):
        if text.startswith(article):
            return text[len(article) :] + "s"
    return text


def _is_secret(name: str) -> bool:
    if name.startswith(tuple(f"{s}[" for s in SECRET_SETTINGS)):
        name = name[name.index("[") :]  # producer_config['sasl.password'] -> its key decides
    # `key` (an upsert key) and `*_column` names hold column names, not keys or secrets.
    if name == "key" or name.endswith("_column") or name.endswith("_columns"):
        return False
    return name in SECRET_SETTINGS or is_secret(name)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
