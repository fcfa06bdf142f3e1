"""What a JSON Lines participant's CommitHandle carries, and the one place it is parsed.

A handle is stored in the decision record and read back by another process, possibly by a
newer version of this sink: its sink-specific part (`CommitHandle.details`) is a versioned
dataclass, written by `JsonlHandleDetails.to_details` and read by `JsonlHandle.parse` only.
It holds what phase 2 needs besides the participant's name, and nothing secret (handles are
stored and shown by `durable-sinks inspect`). A version this build does not know is refused
as corrupt, never guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass

from durable_sinks.core.errors import ManifestCorruptError
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import JSON, CommitHandle

#: The version of `details` this build writes and reads.
DETAILS_VERSION = 1


@dataclass(frozen=True)
class JsonlHandleDetails:
    """The sink's part of a handle: the job that wrote it (checked against the folder's
    owner) and the part (the published folder's name)."""

    job_id: str
    part: str

    def to_details(self) -> dict[str, JSON]:
        return {"version": DETAILS_VERSION, "job_id": self.job_id, "part": self.part}


@dataclass(frozen=True)
class JsonlHandle:
    """A parsed handle: the protocol's handle, its participant name and its details."""

    handle: CommitHandle
    participant: ParticipantName
    details: JsonlHandleDetails

    @classmethod
    def parse(cls, handle: CommitHandle) -> JsonlHandle:
        """ManifestCorruptError if `handle` is not one this build of the sink wrote."""
        details = handle.details
        version = details.get("version")
        if version != DETAILS_VERSION:
            raise ManifestCorruptError(
                f"jsonl handle details version {version!r} is not supported (this build reads "
                f"version {DETAILS_VERSION})",
                sink=handle.sink,
                epoch=handle.epoch,
                fix="run the durable-sinks version that wrote it to finish recovery",
            )
        job_id, part = details.get("job_id"), details.get("part")
        participant = ParticipantName.parse(handle.participant)
        if not isinstance(job_id, str) or not isinstance(part, str) or participant is None:
            raise ManifestCorruptError(
                f"malformed jsonl handle for participant {handle.participant!r}",
                sink=handle.sink,
                epoch=handle.epoch,
            )
        if participant.part != part or participant.epoch != handle.epoch:
            raise ManifestCorruptError(
                f"jsonl handle of participant {handle.participant!r} says part {part!r} and "
                f"epoch {handle.epoch}",
                sink=handle.sink,
                epoch=handle.epoch,
            )
        return cls(handle, participant, JsonlHandleDetails(job_id, part))
