"""The epoch marker `_epochs/<epoch>.json`: the S3 sink's record, and its readers' proof, that an
epoch is whole.

It lists every object of the epoch (key, size, ETag, rows, participant, SHA-256 of the bytes)
with the epoch's totals and a checksum over that list. Its content is a function of the
epoch's decision only (no time stamps), so two processes that publish the same decided epoch
(a recovery and a replay) write the same bytes, and the second create-only PUT can check it
found exactly what it would have written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from durable_sinks.core.errors import CorruptRecordError
from durable_sinks.core.protocol import CommitHandle

from .handles import S3HandleDetails

FORMAT = "durable-sinks/s3-epoch"
VERSION = 1


@dataclass(frozen=True)
class EpochObject:
    key: str
    size: int
    etag: str | None
    rows: int
    participant: str
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "size": self.size,
            "etag": self.etag,
            "rows": self.rows,
            "participant": self.participant,
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class EpochMarker:
    job_id: str
    sink: str
    epoch: int
    objects: tuple[EpochObject, ...]

    @classmethod
    def of(cls, job_id: str, sink: str, epoch: int, handles: Sequence[CommitHandle]) -> EpochMarker:
        objects = [
            EpochObject(
                key=o.key,
                size=o.size,
                etag=o.etag,
                rows=o.rows,
                participant=h.participant,
                sha256=o.sha256,
            )
            for h in handles
            for o in S3HandleDetails.of(h).objects
        ]
        return cls(job_id, sink, epoch, tuple(sorted(objects, key=lambda o: o.key)))

    @property
    def rows(self) -> int:
        return sum(o.rows for o in self.objects)

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects)

    def to_bytes(self) -> bytes:
        listed = [o.to_json() for o in self.objects]
        body = {
            "format": FORMAT,
            "version": VERSION,
            "job_id": self.job_id,
            "sink": self.sink,
            "epoch": self.epoch,
            "rows": self.rows,
            "bytes": self.size,
            "objects": listed,
            "checksum": _checksum(listed),
        }
        return (json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str) -> EpochMarker:
        fix = (
            "the marker was changed outside durable-sinks; restore it from the epoch's "
            "decision record (durable-sinks' decision store) or a backup"
        )
        try:
            body = json.loads(data)
            problem = _problem(body)
            if problem is None:
                return cls(
                    str(body["job_id"]),
                    str(body["sink"]),
                    int(body["epoch"]),
                    tuple(
                        EpochObject(
                            str(o["key"]),
                            int(o["size"]),
                            None if o.get("etag") is None else str(o["etag"]),
                            int(o["rows"]),
                            str(o["participant"]),
                            str(o["sha256"]),
                        )
                        for o in body["objects"]
                    ),
                )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        raise CorruptRecordError(f"{source}: not a valid epoch marker ({problem})", fix=fix)


def _problem(body: Any) -> str | None:
    """What makes a parsed marker unusable, or None."""
    if not isinstance(body, dict):
        return "not a JSON object"
    if body.get("format") != FORMAT or body.get("version") != VERSION:
        return f"format {body.get('format')!r} version {body.get('version')!r}"
    if body.get("checksum") != _checksum(body.get("objects")):
        return "the checksum over its objects does not match"
    return None


def _checksum(listed: Any) -> str:
    return hashlib.sha256(
        json.dumps(listed, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
