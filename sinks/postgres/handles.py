"""What a Postgres participant's commit handle holds (typed and versioned, core/handles.py).

The participant's name is its prepared transaction's gid, which is all COMMIT PREPARED and
ROLLBACK PREPARED need; the details add the part, which finds the participant's marker row
when the transaction is already gone (committed before)."""

from __future__ import annotations

from dataclasses import dataclass

from durable_sinks.core.handles import HandleDetails


@dataclass(frozen=True)
class PostgresHandleDetails(HandleDetails):
    """The part of the epoch the participant wrote (its marker row's key)."""

    part: str = "0"
