"""What a JSON Lines participant's CommitHandle carries, and the one place it is parsed.

A handle is stored in the decision record and read back by another process, possibly by a
newer version of this sink: its sink-specific part (`CommitHandle.details`) is a versioned
dataclass (core/handles.py), written by `JsonlHandleDetails.to_json` and read by
`JsonlHandle.parse` only.
It holds what phase 2 needs besides the participant's name, and nothing secret (handles are
stored and shown by `durable-sinks inspect`). A version this build does not know is refused
as corrupt, never guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass

from durable_sinks.core.errors import CorruptRecordError
from durable_sinks.core.handles import HandleDetails
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle


@dataclass(frozen=True)
class JsonlHandleDetails(HandleDetails):
    """The sink's part of a handle: the job that wrote it (checked against the folder's
    owner) and the part (the published folder's name). Versioned by `HandleDetails.VERSION`;
    written with `to_json()`, read back only through `JsonlHandle.parse`."""

    job_id: str
    part: str


@dataclass(frozen=True)
class JsonlHandle:
    """A parsed handle: the protocol's handle, its participant name and its details."""

    handle: CommitHandle
    participant: ParticipantName
    details: JsonlHandleDetails

    @classmethod
    def parse(cls, handle: CommitHandle) -> JsonlHandle:
        """CorruptRecordError if `handle` is not one this build of the sink wrote."""
        details = JsonlHandleDetails.of(handle)
        participant = ParticipantName.parse(handle.participant)
        if participant is None:
            raise CorruptRecordError(
                f"jsonl handle names participant {handle.participant!r}, not a durable-sinks "
                "participant name",
                sink=handle.sink,
                epoch=handle.epoch,
            )
        if participant.part != details.part or participant.epoch != handle.epoch:
            raise CorruptRecordError(
                f"jsonl handle of participant {handle.participant!r} says part "
                f"{details.part!r} and epoch {handle.epoch}",
                sink=handle.sink,
                epoch=handle.epoch,
            )
        return cls(handle, participant, details)
