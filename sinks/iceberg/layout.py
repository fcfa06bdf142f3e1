"""Names of an Iceberg sink's data files and table properties.

A participant's data files are named by pyiceberg's writer `00000-<task>-<write_uuid>.parquet`;
the write uuid and the task numbers are built from the participant (not random) and read back
to it, so recovery finds a participant's files by listing the table's data folder, even those
of a participant that crashed before it prepared:

    write uuid, bits 127..96  the job and sink (a hash)
                bits  95..64  the generation
                bits  63..48  the attempt
                bits  47..0   the epoch
    task number               the part (its ASCII bytes as one integer) << 32, plus the
                              file's number within the participant

The part tells the participants of one epoch apart in executor mode (one per Spark task
attempt, `p<partition>-t<attempt id>`); in driver mode it is the driver's part, "0".
"""

from __future__ import annotations

import hashlib
import itertools
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from durable_sinks.core.formats import stored_format
from durable_sinks.core.naming import ParticipantName, component

PREFIX = "durable-sinks"
#: The snapshot summary keys of an epoch's commit.
SUMMARY_JOB = f"{PREFIX}.job"
SUMMARY_SINK = f"{PREFIX}.sink"
SUMMARY_EPOCH = f"{PREFIX}.epoch"
#: The participants the commit appended (a JSON list of participant names).
SUMMARY_PARTICIPANTS = f"{PREFIX}.participants"
#: The version of these keys' format (SNAPSHOT_SUMMARY).
SUMMARY_VERSION = f"{PREFIX}.version"
SNAPSHOT_SUMMARY = stored_format(
    "Iceberg snapshot summary",
    current=1,
    oldest=1,
    where=f"each epoch's snapshot summary, keys `{PREFIX}.*`: its version as "
    f"`{SUMMARY_VERSION}` (absent: version 1)",
)
#: Bits of a task number that count the participant's files (below them: the part).
_FILE_BITS = 32
_FILE = re.compile(
    r"/\d+-(?P<task>\d+)-(?P<uuid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.parquet$"
)


@dataclass(frozen=True)
class Layout:
    """The names one job's sink uses in its table."""

    job_id: str
    sink: str

    @property
    def epoch_property(self) -> str:
        """The table property holding the highest epoch committed by this job's sink."""
        return self._property("epoch")

    @property
    def journal_property(self) -> str:
        """The table property saying that every participant of this job's sink writes its
        entry in the epoch journal (journal.py) before its first data file: set by each
        epoch's commit, so that a start finds the participants left prepared by listing the
        journal instead of the table's data folder (recovery.py)."""
        return self._property("journal")

    def _property(self, name: str) -> str:
        return f"{PREFIX}.{component(self.job_id)}.{component(self.sink)}.{name}"

    def epoch_of(self, summary: Mapping[str, str] | None) -> int | None:
        """The epoch a snapshot committed for this job's sink, from its summary; None for a
        snapshot of anyone else (another job or sink, another writer)."""
        if (
            summary is None
            or summary.get(SUMMARY_JOB) != self.job_id
            or summary.get(SUMMARY_SINK) != self.sink
            or not str(summary.get(SUMMARY_EPOCH, "")).isdigit()
        ):
            return None
        found = summary.get(SUMMARY_VERSION)
        SNAPSHOT_SUMMARY.check(
            int(found) if found is not None and found.isdigit() else found,
            source=f"the snapshot summary of epoch {summary.get(SUMMARY_EPOCH)}",
            job=self.job_id,
            sink=self.sink,
        )
        return int(str(summary.get(SUMMARY_EPOCH)))

    @property
    def _tag(self) -> int:
        digest = hashlib.sha256(f"{self.job_id}\0{self.sink}".encode()).digest()
        return int.from_bytes(digest[:4], "big")

    def write_uuid(self, name: ParticipantName) -> uuid.UUID:
        if name.generation >= 1 << 32 or name.attempt >= 1 << 16 or name.epoch >= 1 << 48:
            raise ValueError(f"participant {name} is beyond the data file naming's range")
        return uuid.UUID(
            int=(self._tag << 96) | (name.generation << 64) | (name.attempt << 48) | name.epoch
        )

    @staticmethod
    def task_numbers(name: ParticipantName) -> itertools.count[int]:
        """The task numbers of the participant's files, in the order they are written."""
        return itertools.count(int.from_bytes(name.part.encode("ascii"), "big") << _FILE_BITS)

    def parse(self, path: str) -> ParticipantName | None:
        """The participant that wrote a data file of this job's sink, else None."""
        found = _FILE.search(path)
        if found is None:
            return None
        value = uuid.UUID(found["uuid"]).int
        if value >> 96 != self._tag:
            return None
        encoded = int(found["task"]) >> _FILE_BITS
        try:
            part = encoded.to_bytes((encoded.bit_length() + 7) // 8, "big").decode("ascii")
            return ParticipantName.build(
                self.job_id,
                self.sink,
                value & ((1 << 48) - 1),
                part,
                (value >> 64) & 0xFFFFFFFF,
                (value >> 48) & 0xFFFF,
            )
        except ValueError:  # not a part this sink wrote
            return None
