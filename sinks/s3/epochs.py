"""The epoch marker `_epochs/<epoch>.json`: the S3 sink's record, and its readers' proof, that an
epoch is whole.

It lists every object of the epoch (key, size, ETag, rows, participant, SHA-256 of the bytes)
with the epoch's totals and a checksum over that list. Each object also names its Parquet
schema, an index into the marker's `schemas` (each distinct Arrow schema of the epoch once,
base64 of its IPC form): readers unify them (core/evolution.py) into the dataset's schema. A
marker written before schemas were recorded has neither; its checksum covers the objects
alone, a marker with schemas covers both. Its content is a function of the
epoch's decision only (no time stamps), so two processes that publish the same decided epoch
(a recovery and a replay) write the same bytes, and the second create-only PUT can check it
found exactly what it would have written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durable_sinks.core.errors import MALFORMED, CorruptRecordError
from durable_sinks.core.evolution import schema_of_text, unify
from durable_sinks.core.formats import stored_format
from durable_sinks.core.protocol import CommitHandle

from .handles import S3HandleDetails

if TYPE_CHECKING:
    import pyarrow as pa

FORMAT = "durable-sinks/s3-epoch"
EPOCH_MARKER = stored_format(
    "S3 epoch marker",
    current=1,
    oldest=1,
    where='`<prefix>/_epochs/<epoch>.json`: JSON `{"format": "durable-sinks/s3-epoch", '
    '"version": ...}`',
)
VERSION = EPOCH_MARKER.current


@dataclass(frozen=True)
class EpochObject:
    key: str
    size: int
    etag: str | None
    rows: int
    participant: str
    sha256: str
    #: Index of the object's schema in its marker's `schemas`; None when not recorded.
    schema: int | None = None

    def to_json(self) -> dict[str, Any]:
        listed: dict[str, Any] = {
            "key": self.key,
            "size": self.size,
            "etag": self.etag,
            "rows": self.rows,
            "participant": self.participant,
            "sha256": self.sha256,
        }
        if self.schema is not None:
            listed["schema"] = self.schema
        return listed


@dataclass(frozen=True)
class EpochMarker:
    job_id: str
    sink: str
    epoch: int
    objects: tuple[EpochObject, ...]
    #: The distinct schemas of the objects (base64 Arrow IPC), in the order of their first
    #: object.
    schemas: tuple[str, ...] = ()

    @classmethod
    def of(cls, job_id: str, sink: str, epoch: int, handles: Sequence[CommitHandle]) -> EpochMarker:
        described = sorted(
            ((h.participant, o) for h in handles for o in S3HandleDetails.of(h).objects),
            key=lambda po: po[1].key,
        )
        schemas: dict[str, int] = {}
        objects = []
        for participant, o in described:
            index = None if o.schema is None else schemas.setdefault(o.schema, len(schemas))
            objects.append(
                EpochObject(
                    key=o.key,
                    size=o.size,
                    etag=o.etag,
                    rows=o.rows,
                    participant=participant,
                    sha256=o.sha256,
                    schema=index,
                )
            )
        return cls(job_id, sink, epoch, tuple(objects), tuple(schemas))

    def object_schema(self, listed: EpochObject) -> pa.Schema | None:
        """The Arrow schema `listed` (one of this marker's objects) was written with."""
        return None if listed.schema is None else schema_of_text(self.schemas[listed.schema])

    def schema(self) -> pa.Schema | None:
        """The epoch's schema: its objects' schemas unified (core/evolution.py); None when
        the epoch has no objects or they were written before schemas were recorded.
        SchemaMismatchError if two objects' schemas cannot be unified."""
        if not self.objects or any(o.schema is None for o in self.objects):
            return None
        return unify(
            (schema_of_text(text) for text in self.schemas),
            sink=self.sink,
            epoch=self.epoch,
        )

    @property
    def rows(self) -> int:
        return sum(o.rows for o in self.objects)

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects)

    def to_bytes(self) -> bytes:
        listed = [o.to_json() for o in self.objects]
        body: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "job_id": self.job_id,
            "sink": self.sink,
            "epoch": self.epoch,
            "rows": self.rows,
            "bytes": self.size,
            "objects": listed,
            "checksum": _checksum(listed, list(self.schemas)),
        }
        if self.schemas:
            body["schemas"] = list(self.schemas)
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
                EPOCH_MARKER.check(body.get("version"), source=source)
            if problem is None:
                schemas = tuple(str(text) for text in body.get("schemas", []))
                marker = cls(
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
                            None if o.get("schema") is None else int(o["schema"]),
                        )
                        for o in body["objects"]
                    ),
                    schemas,
                )
                if all(o.schema is None or 0 <= o.schema < len(schemas) for o in marker.objects):
                    return marker
                problem = "an object names a schema the marker does not list"
        except MALFORMED as exc:
            problem = f"{type(exc).__name__}: {exc}"
        raise CorruptRecordError(f"{source}: not a valid epoch marker ({problem})", fix=fix)


def _problem(body: Any) -> str | None:
    """What makes a parsed marker unusable, or None."""
    if not isinstance(body, dict):
        return "not a JSON object"
    if body.get("format") != FORMAT:
        return f"format {body.get('format')!r}"
    if body.get("checksum") != _checksum(body.get("objects"), body.get("schemas", [])):
        return "the checksum over its objects does not match"
    return None


def _checksum(listed: Any, schemas: Any) -> str:
    """SHA-256 over the objects listing, and the schemas when there are any (a marker
    without schemas keeps the checksum it always had)."""
    covered = {"objects": listed, "schemas": schemas} if schemas else listed
    return hashlib.sha256(
        json.dumps(covered, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
