"""A sink's own part of a commit handle (`CommitHandle.details`): typed, versioned, parsed in
one place.

Each sink declares its details as a frozen dataclass extending `HandleDetails`, whose fields
are JSON values: str, int, float, bool, None, tuples of them, mappings of str to anything
JSON, nested frozen dataclasses of the same kind, and unions of those. `to_json()` is what
goes into the handle (with the details' own format version as `"v"`); `HandleDetails.of`
reads it back and is the only place a handle's details are parsed: anything malformed is a
CorruptRecordError naming the participant, never a KeyError deep inside a commit; details
of a newer version than this release reads are a StoredFormatError (core/formats.py).

Handles are stored in decision records that outlive a deployment, so a format change keeps
reading the old one: raise `VERSION` and turn older details into the new shape in
`_upgrade`. Details written before they carried a version read as version 1.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from .errors import CorruptRecordError
from .formats import StoredFormat
from .protocol import JSON, CommitHandle
from .settings import type_hints

D = TypeVar("D", bound="HandleDetails")

#: Details already parsed, by the handle object and the class read as: one epoch's commit
#: reads each handle's details several times (its files, its shape, its journal). Each entry
#: holds its handle, so an id is never reused while its entry lives; handles are immutable.
_PARSED: dict[tuple[int, type[Any]], tuple[CommitHandle, Any]] = {}
_PARSED_KEPT = 4096


class _MalformedError(Exception):
    """A value that does not fit its field (the message says which and why)."""


@dataclasses.dataclass(frozen=True)
class HandleDetails:
    """Base of a sink's handle details (see the module docs)."""

    #: The details' format version, stored as "v"; raise it when a field changes meaning.
    VERSION: ClassVar[int] = 1

    def to_json(self) -> dict[str, JSON]:
        encoded = _encode(self)
        assert isinstance(encoded, dict)
        return {"v": self.VERSION, **encoded}

    @classmethod
    def of(cls: type[D], handle: CommitHandle) -> D:
        """The details of `handle`, checked field by field; CorruptRecordError if they are
        malformed or newer than this build reads."""
        key = (id(handle), cls)
        known = _PARSED.get(key)
        if known is not None and known[0] is handle:
            return typing.cast(D, known[1])
        parsed = cls._parsed(handle)
        if len(_PARSED) >= _PARSED_KEPT:
            _PARSED.clear()
        _PARSED[key] = (handle, parsed)
        return parsed

    @classmethod
    def _parsed(cls: type[D], handle: CommitHandle) -> D:
        data = dict(handle.details)
        version = data.pop("v", None)
        if not isinstance(version, int | None) or isinstance(version, bool):
            raise cls._corrupt(handle, f"its details version {version!r} is not a version")
        version = cls.stored_format().check(
            version,
            source=f"commit handle of participant {handle.participant}",
            sink=handle.sink,
            epoch=handle.epoch,
        )
        try:
            upgraded = cls._upgrade(version, data)
            parsed = _decode(cls, upgraded, "details")
        except _MalformedError as exc:
            raise cls._corrupt(handle, str(exc)) from None
        return typing.cast(D, parsed)

    @classmethod
    def stored_format(cls) -> StoredFormat:
        """The details' stored format: this release writes `VERSION` and reads every older
        version (`_upgrade` turns it into the current shape)."""
        return StoredFormat(
            f"{cls.__name__} (a commit handle's details)",
            current=cls.VERSION,
            oldest=1,
            where=f'a commit handle\'s `details`, version as `"v"` ({cls.__module__})',
        )

    @classmethod
    def _upgrade(cls, version: int, data: dict[str, Any]) -> dict[str, Any]:
        """`data` of format `version` in the current format (the identity until a version
        changes)."""
        return data

    @classmethod
    def _corrupt(cls, handle: CommitHandle, problem: str) -> CorruptRecordError:
        return CorruptRecordError(
            f"commit handle of participant {handle.participant} is malformed: {problem}",
            sink=handle.sink,
            epoch=handle.epoch,
            fix=f"this handle was not written by this sink ({cls.__name__}); check that the "
            "job's sinks keep their names and kinds across restarts",
        )


def _encode(value: Any) -> JSON:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _encode(v) for k, v in value.items()}
    return typing.cast(JSON, value)


def _decode(hint: Any, value: Any, where: str) -> Any:
    """`value` as `hint` describes it, or _MalformedError naming `where`."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        for option in typing.get_args(hint):
            try:
                return _decode(option, value, where)
            except _MalformedError:
                continue
        raise _MalformedError(f"{where} is {value!r}, not {_name(hint)}")
    if hint is type(None):
        if value is None:
            return None
        raise _MalformedError(f"{where} is {value!r}, not null")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise _MalformedError(f"{where} is {value!r}, not an object")
        hints = type_hints(hint)
        fields: dict[str, Any] = {}
        for field in dataclasses.fields(hint):
            if field.name in value:
                fields[field.name] = _decode(
                    hints[field.name], value[field.name], f"{where}.{field.name}"
                )
            elif (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise _MalformedError(f"{where} has no {field.name!r}")
        return hint(**fields)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise _MalformedError(f"{where} is {value!r}, not a list")
        (item, *_) = typing.get_args(hint)
        return tuple(_decode(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict) or hint is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise _MalformedError(f"{where} is {value!r}, not an object")
        return dict(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool):
        raise _MalformedError(f"{where} is {value!r}, not an integer")
    if isinstance(hint, type) and isinstance(value, hint):
        return value
    raise _MalformedError(f"{where} is {value!r}, not {_name(hint)}")


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint)
