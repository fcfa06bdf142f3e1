"""Where the S3 sink keeps what under its prefix, and how a key is read back.

    <prefix>/epoch=<epoch, 12 digits>/part-<part>_g<generation>a<attempt>_<n>.parquet
        the epoch's data objects: multipart uploads until the epoch commits, then objects
    <prefix>/_epochs/<epoch, 12 digits>.json
        the epoch's marker: created (only if absent) once every object of the epoch is
        complete; readers trust only epochs that have one
    <prefix>/_job.json
        which job and sink own the prefix (created at the first start)
    <prefix>/_newest_epoch.json
        a hint: the newest epoch with a marker when the sink last opened (written at open,
        after the marker it names; checked against the markers before it is used)
    <prefix>/_durable/
        the start-up probes' short-lived objects and uploads

A data key names its participant (part, generation, attempt) and the object's number within
it, so recovery knows from ListMultipartUploads alone which generation left an upload and to
which participant of which epoch it belongs. Zero-padded epochs make key order epoch order:
`epoch=` folders and markers list in the order they were written. Folders starting with `_`
are skipped by Hive-style readers (Spark, pyarrow, DuckDB).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from durable_sinks.clients.s3 import S3Location
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.naming import ParticipantName

EPOCH_DIGITS = 12
MAX_EPOCH = 10**EPOCH_DIGITS - 1
MARKERS = "_epochs"
OWNER = "_job.json"
NEWEST = "_newest_epoch.json"
PROBES = "_durable"
_DATA = re.compile(
    r"^epoch=(?P<epoch>\d{12})/part-(?P<part>[A-Za-z0-9._-]{1,40})"
    r"_g(?P<generation>\d+)a(?P<attempt>\d+)_(?P<number>\d+)\.parquet$"
)
_MARKER = re.compile(r"^(?P<epoch>\d{12})\.json$")


def epoch_text(epoch: int) -> str:
    if not 0 <= epoch <= MAX_EPOCH:
        raise ConfigError(
            f"epoch {epoch} does not fit the S3 sink's {EPOCH_DIGITS}-digit epoch folders",
            fix="Spark's batch ids start at 0; a job with more batches than this needs a new "
            "prefix",
        )
    return f"{epoch:0{EPOCH_DIGITS}d}"


@dataclass(frozen=True)
class DataKey:
    """One data object's place: the participant it belongs to and its number within it."""

    epoch: int
    part: str
    generation: int
    attempt: int
    number: int

    @classmethod
    def of(cls, name: ParticipantName, number: int) -> DataKey:
        return cls(name.epoch, name.part, name.generation, name.attempt, number)

    def relative(self) -> str:
        return (
            f"epoch={epoch_text(self.epoch)}/part-{self.part}_g{self.generation}"
            f"a{self.attempt}_{self.number:05d}.parquet"
        )


class Layout:
    """The keys of one sink's prefix."""

    def __init__(self, location: S3Location) -> None:
        self.location = location
        self.bucket = location.bucket

    def data_key(self, key: DataKey) -> str:
        return self.location.key(key.relative())

    def epoch_folder(self, epoch: int) -> str:
        """The listing prefix of one epoch's data objects and uploads."""
        return self.location.key(f"epoch={epoch_text(epoch)}") + "/"

    @property
    def data_folder(self) -> str:
        """The listing prefix of every epoch's data (`<prefix>/epoch=`)."""
        return self.location.key("epoch=")

    def parse_data(self, key: str) -> DataKey | None:
        """The DataKey of a key under the prefix, or None for anything else (a foreign
        object is never mistaken for one of ours)."""
        folder = self.location.folder
        if not key.startswith(folder):
            return None
        match = _DATA.match(key[len(folder) :])
        if match is None:
            return None
        return DataKey(
            int(match["epoch"]),
            match["part"],
            int(match["generation"]),
            int(match["attempt"]),
            int(match["number"]),
        )

    def marker_key(self, epoch: int) -> str:
        return self.location.key(MARKERS, f"{epoch_text(epoch)}.json")

    @property
    def marker_folder(self) -> str:
        return self.location.key(MARKERS) + "/"

    def parse_marker(self, key: str) -> int | None:
        if not key.startswith(self.marker_folder):
            return None
        match = _MARKER.match(key[len(self.marker_folder) :])
        return int(match["epoch"]) if match else None

    @property
    def newest_key(self) -> str:
        """The hint of the newest epoch with a marker (recovery.last_committed)."""
        return self.location.key(NEWEST)

    @property
    def owner_key(self) -> str:
        return self.location.key(OWNER)

    @property
    def probe_folder(self) -> str:
        return self.location.key(PROBES) + "/"
