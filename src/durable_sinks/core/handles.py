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


#: Where a value sits in the details, rendered only for an error: "details", or the place
#: of the object or list holding it and its field name or index.
Where = str | tuple["Where", str | int]
#: Reads a value of one type hint (its Where given for errors).
Decoder = typing.Callable[[Any, Where], Any]
_DECODERS: dict[Any, Decoder] = {}


def _decode(hint: Any, value: Any, where: Where) -> Any:
    """`value` as `hint` describes it, or _MalformedError naming `where`."""
    return _decoder(hint)(value, where)


def _at(where: Where) -> str:
    if isinstance(where, str):
        return where
    parent, key = where
    return f"{_at(parent)}[{key}]" if isinstance(key, int) else f"{_at(parent)}.{key}"


def _decoder(hint: Any) -> Decoder:
    """The reader of `hint`'s values, made once per hint: a handle's details are read per
    participant per epoch, and working the hints out each time took most of a read."""
    found = _DECODERS.get(hint)
    if found is None:
        found = _DECODERS[hint] = _make_decoder(hint)
    return found


def _make_decoder(hint: Any) -> Decoder:
    def refuse(value: Any, where: Where, what: str | None = None) -> typing.NoReturn:
        raise _MalformedError(f"{_at(where)} is {value!r}, not {what or _name(hint)}")

    if hint is Any:
        return lambda value, where: value
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        options = [_decoder(option) for option in typing.get_args(hint)]

        def union(value: Any, where: Where) -> Any:
            for option in options:
                try:
                    return option(value, where)
                except _MalformedError:
                    continue
            refuse(value, where)

        return union
    if hint is type(None):

        def null(value: Any, where: Where) -> None:
            if value is not None:
                refuse(value, where, "null")

        return null
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass_decoder(hint)
    if origin is tuple:
        (item_hint, *_) = typing.get_args(hint)
        item = _decoder(item_hint)

        def items(value: Any, where: Where) -> tuple[Any, ...]:
            if not isinstance(value, list | tuple):
                refuse(value, where, "a list")
            return tuple(item(v, (where, i)) for i, v in enumerate(value))

        return items
    if origin in (Mapping, dict) or hint is dict:

        def mapping(value: Any, where: Where) -> dict[str, Any]:
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                refuse(value, where, "an object")
            return dict(value)

        return mapping
    if hint is float:

        def number(value: Any, where: Where) -> float:
            if isinstance(value, float):
                return value
            if isinstance(value, int) and not isinstance(value, bool):
                return float(value)
            refuse(value, where)

        return number
    if hint is int:

        def integer(value: Any, where: Where) -> int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            refuse(value, where, "an integer" if isinstance(value, bool) else None)

        return integer
    if isinstance(hint, type):

        def instance(value: Any, where: Where) -> Any:
            if isinstance(value, hint):
                return value
            refuse(value, where)

        return instance

    def unknown(value: Any, where: Where) -> Any:
        refuse(value, where)

    return unknown


def _dataclass_decoder(hint: type[Any]) -> Decoder:
    hints = type_hints(hint)
    fields = [
        (
            field.name,
            _decoder(hints[field.name]),
            field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING,
        )
        for field in dataclasses.fields(hint)
    ]

    def decode(value: Any, where: Where) -> Any:
        if not isinstance(value, Mapping):
            raise _MalformedError(f"{_at(where)} is {value!r}, not an object")
        given: dict[str, Any] = {}
        for name, decoder, required in fields:
            if name in value:
                given[name] = decoder(value[name], (where, name))
            elif required:
                raise _MalformedError(f"{_at(where)} has no {name!r}")
        return hint(**given)

    return decode


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint)
