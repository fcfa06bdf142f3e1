"""The decision record: the durable statement that an epoch commits, with every participant."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_sinks.core.content import ContentSummary
from durable_sinks.core.errors import (
    MALFORMED,
    CorruptRecordError,
    ManifestCorruptError,
    StoredFormatError,
)
from durable_sinks.core.formats import stored_format
from durable_sinks.core.protocol import JSON, CommitHandle

FORMAT = "durable-sinks/decision"
DECISION_RECORD = stored_format(
    "decision record",
    current=1,
    oldest=1,
    where="every decision store, and the last resource's record (Kafka's progress record, "
    'the Postgres marker row): a JSON envelope `{"format": "durable-sinks/decision", '
    '"version": ...}`',
)
VERSION = DECISION_RECORD.current


@dataclass(frozen=True)
class DecisionRecord:
    """Epoch `epoch` of job `job_id` commits exactly the participants in `handles`.

    Written once (create-only) by the coordinator of generation `generation`; it never
    changes afterwards. Participants of the epoch not listed here are losers: recovery rolls
    them back.

    `source` identifies the stream whose data the epoch holds (e.g. a Spark query's id, which
    its checkpoint keeps across restarts); None when the caller does not say. A replay of a
    decided epoch by a different source is another query writing under the same job id.
    `first_epoch` is the epoch of that stream's first batch (its batch b is epoch
    first_epoch + b: a stream started from a new checkpoint continues after the epochs of
    the one before); None in a record without a source, and 0 is meant where a record with a
    source lacks it. Not compared.

    `content` summarises the rows the epoch was given (count and order-independent digest,
    durable_sinks.core.content): a replay of the epoch is compared with it (the replay check).
    None when not computed (executor mode, at least once, replay_check="off", or a record
    written before it existed): such an epoch's replays are not checked. It does not take
    part in comparing records.

    `dead_letters` counts the rows each sink refused and the epoch wrote to the job's
    dead-letter sink, by reason (`{sink: {reason: rows}}`; empty when none, or in executor
    mode, where the dead-letter participants' rows say how many). Not compared either.
    """

    job_id: str
    epoch: int
    generation: int
    handles: tuple[CommitHandle, ...]
    created_at: float = field(default_factory=time.time, compare=False)
    source: str | None = None
    content: ContentSummary | None = field(default=None, compare=False)
    dead_letters: Mapping[str, Mapping[str, int]] = field(default_factory=dict, compare=False)
    first_epoch: int | None = field(default=None, compare=False)

    def participants(self) -> frozenset[tuple[str, str]]:
        """(sink, participant name) of every participant the epoch commits."""
        return frozenset((h.sink, h.participant) for h in self.handles)

    def handle_of(self, handle: CommitHandle) -> CommitHandle:
        """This record's copy of `handle` (same sink and participant): what recovery commits,
        as it holds all the commit needs, where a sink may rebuild its leftovers' handles from
        names alone. KeyError if the record does not commit it."""
        for mine in self.handles:
            if (mine.sink, mine.participant) == (handle.sink, handle.participant):
                return mine
        raise KeyError(f"epoch {self.epoch} does not commit {handle.sink}/{handle.participant}")

    def handles_for(self, sink: str) -> list[CommitHandle]:
        return [h for h in self.handles if h.sink == sink]

    def commits(self, handle: CommitHandle) -> bool:
        return (handle.sink, handle.participant) in self.participants()

    def rows(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for h in self.handles:
            totals[h.sink] = totals.get(h.sink, 0) + h.rows
        return totals

    # -- serialised form ---------------------------------------------------------------------
    def to_json(self) -> dict[str, JSON]:
        data: dict[str, JSON] = {
            "job_id": self.job_id,
            "epoch": self.epoch,
            "generation": self.generation,
            "created_at": self.created_at,
            "handles": [h.to_json() for h in self.handles],
        }
        if self.source is not None:
            data["source"] = self.source
        if self.first_epoch is not None:
            data["first_epoch"] = self.first_epoch
        if self.content is not None:
            data["content"] = self.content.to_json()
        if self.dead_letters:
            data["dead_letters"] = {s: dict(r) for s, r in self.dead_letters.items()}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, source: str = "record") -> DecisionRecord:
        try:
            return cls(
                job_id=str(data["job_id"]),
                epoch=int(data["epoch"]),
                generation=int(data["generation"]),
                created_at=float(data["created_at"]),
                handles=tuple(CommitHandle.from_json(h) for h in data["handles"]),
                source=None if data.get("source") is None else str(data["source"]),
                first_epoch=(None if data.get("first_epoch") is None else int(data["first_epoch"])),
                content=(
                    None
                    if data.get("content") is None
                    else ContentSummary.from_json(data["content"])
                ),
                dead_letters={
                    str(sink): {str(reason): int(n) for reason, n in reasons.items()}
                    for sink, reasons in (data.get("dead_letters") or {}).items()
                },
            )
        except StoredFormatError:
            raise
        except (*MALFORMED, CorruptRecordError) as exc:
            problem = f"{exc!r}"[:500]
            raise ManifestCorruptError(f"{source}: malformed decision record ({problem})") from exc

    def to_bytes(self) -> bytes:
        """Canonical JSON inside an envelope that names the format and carries a SHA-256 of
        the record, so truncation or corruption is detected on read."""
        body = _canonical(self.to_json())
        digest = hashlib.sha256(body.encode()).hexdigest()
        # The envelope's canonical JSON, its keys in sorted order, with the body spliced in
        # as it is (one encoding of the handles, not three: 4 ms of a 128-part record).
        return (
            f'{{"format":{_canonical(FORMAT)},"record":{body},"sha256":"{digest}",'
            f'"version":{_canonical(VERSION)}}}\n'
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str) -> DecisionRecord:
        """Parse a stored record; ManifestCorruptError (naming `source`) if it is damaged."""
        fix = (
            "the decision store was damaged outside durable-sinks; restore the record from a "
            "backup, or move it aside only after checking every sink holds that epoch fully"
        )
        try:
            envelope = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ManifestCorruptError(
                f"{source}: decision record is not valid JSON ({len(data)} bytes; truncated?)",
                fix=fix,
            ) from exc
        if not isinstance(envelope, dict) or envelope.get("format") != FORMAT:
            raise ManifestCorruptError(f"{source}: not a durable-sinks decision record", fix=fix)
        DECISION_RECORD.check(envelope.get("version"), source=source)
        record = envelope.get("record")
        if not isinstance(record, dict):
            raise ManifestCorruptError(f"{source}: decision record has no body", fix=fix)
        digest = hashlib.sha256(_canonical(record).encode()).hexdigest()
        if digest != envelope.get("sha256"):
            raise ManifestCorruptError(f"{source}: decision record fails its checksum", fix=fix)
        return cls.from_json(record, source=source)


def _canonical(value: object) -> str:
    # (No check for circular references: a record is a tree of fresh dicts and lists, and
    # the check took a sixth of a 128-part record's encoding.)
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, check_circular=False
    )
