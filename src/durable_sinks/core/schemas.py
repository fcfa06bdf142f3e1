"""Arrow schemas compared in words, for the errors of sinks that keep one schema per dataset."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


def schema_difference(expected: pa.Schema, got: pa.Schema) -> str:
    """What differs between the schema a sink holds and a batch's: missing and extra columns,
    then columns whose type or nullability changed (or, if only the order did, that)."""
    wanted = {f.name: f for f in expected}
    seen = {f.name: f for f in got}
    problems = [f"column {n!r} is missing" for n in wanted if n not in seen]
    problems += [f"column {n!r} is not in the sink's schema" for n in seen if n not in wanted]
    problems += [
        f"column {n!r} has type {seen[n].type} (nullable={seen[n].nullable}), expected "
        f"{wanted[n].type} (nullable={wanted[n].nullable})"
        for n in wanted
        if n in seen and not seen[n].equals(wanted[n])
    ]
    return "batch schema differs from the epoch's: " + ("; ".join(problems) or "field order")
