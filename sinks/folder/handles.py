"""What a folder participant's CommitHandle carries, and the one place it is parsed.

A handle is stored in the decision record and read back by another process, possibly by a
newer version of this sink: its sink-specific part (`CommitHandle.details`) is a versioned
dataclass (core/handles.py), written by `FolderHandleDetails.to_json` and read by
`FolderHandle.parse` only. It holds what phase 2 needs besides the participant's name, and
nothing secret (handles are stored and shown by `durable-sinks inspect`). A version this
build does not know is refused as corrupt, never guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass

from durable_sinks.core.errors import CorruptRecordError
from durable_sinks.core.handles import HandleDetails
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle


@dataclass(frozen=True)
class FolderHandleDetails(HandleDetails):
    """The sink's part of a handle: the job that wrote it (checked against the folder's
    owner) and the part (the published folder's name). `schemas` is the Arrow schema
    (core/evolution.schema_text) of each data file, in file order, for an encoder whose files
    hold one schema each (Parquet: `part-00000.parquet` first); empty for JSON Lines, whose
    rows carry their own columns. The staging folder is named by the participant, so nothing
    more is needed to publish or remove it."""

    job_id: str
    part: str
    schemas: tuple[str, ...] = ()


@dataclass(frozen=True)
class FolderHandle:
    """A parsed handle: the protocol's handle, its participant name and its details."""

    handle: CommitHandle
    participant: ParticipantName
    details: FolderHandleDetails

    @classmethod
    def parse(cls, handle: CommitHandle) -> FolderHandle:
        """CorruptRecordError if `handle` is not one this build of the sink wrote: its
        details malformed, its participant not a participant name, or its part and epoch not
        the participant's own (a part naming a path would publish outside the epoch)."""
        details = FolderHandleDetails.of(handle)
        participant = ParticipantName.parse(handle.participant)
        if (
            participant is None
            or participant.part != details.part
            or participant.epoch != handle.epoch
        ):
            raise CorruptRecordError(
                f"participant {handle.participant[:200]!r}'s handle names part "
                f"{details.part[:200]!r} of epoch {handle.epoch}, not its own; nothing was "
                "published for it",
                sink=handle.sink,
                epoch=handle.epoch,
                fix="the decision holds a handle this job did not write: check who writes the "
                "decision store, remove the record, then restart",
            )
        return cls(handle, participant, details)
