"""`TextEnum`: an enumeration whose members are their string values.

Members compare equal to their values, format and `str()` as them, and serialise to JSON as
plain strings: what Python 3.11's `enum.StrEnum` does, on every supported Python (3.10 has
no StrEnum).
"""

from __future__ import annotations

import enum


class TextEnum(str, enum.Enum):
    """A str and an Enum: `str(member)` and `format(member)` give the value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)
