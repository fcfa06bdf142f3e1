"""Where the Delta sink keeps what in the table's folder, and the names it gives.

    [<col>=<value>/...]part-<n>-ds-<owner>-e<epoch>-<part>-g<generation>a<attempt>.<codec>.parquet
        an append participant's data files: in the table's folder (Hive-style partition
        folders), invisible until a log commit adds them
    _durable_sinks/<job>/<sink>/e<epoch>/<part>_g<generation>a<attempt>.json
        the participant's journal: written before each new data file is created (state
        "writing", every file it may have made) and at phase 1's end (state "prepared", the
        whole handle). Recovery reads only these, never lists the table's data.
    _durable_sinks/<job>/<sink>/e<epoch>/<part>_g<generation>a<attempt>-<n>.parquet
        a merge participant's rows (staged: the source of the epoch's MERGE)

`<owner>` is a digest of job and sink, so two jobs writing one table never share a name;
`<job>` and `<sink>` are `core.naming.component` forms. Folders starting with `_` are skipped
by Delta's readers and by VACUUM, which is why only staged rows live there.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from durable_sinks.core.formats import stored_format
from durable_sinks.core.naming import ParticipantName, component

#: The commit information key holding the version of the keys an epoch's commit carries
#: (`durable_sinks.epoch`, `durable_sinks.participants`).
COMMIT_VERSION_KEY = "durable_sinks.version"
COMMIT_INFO = stored_format(
    "Delta commit information",
    current=1,
    oldest=1,
    where="each epoch's commit: `durable_sinks.*` keys of its commit information, the version "
    f"as `{COMMIT_VERSION_KEY}` (absent: version 1)",
)

ROOT = "_durable_sinks"
_JOURNAL = re.compile(
    r"^e(?P<epoch>\d{12})/(?P<part>[A-Za-z0-9._-]{1,40})_g(?P<g>\d+)a(?P<a>\d+)\.json$"
)
_EPOCH_FOLDER = re.compile(r"^e(\d{12})$")
_PLAIN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def app_id(job_id: str, sink: str) -> str:
    """The Delta application-transaction id of one job's sink: its `txn` version is the
    highest committed epoch."""
    return f"durable-sinks:{job_id}:{sink}"


@dataclass(frozen=True)
class Layout:
    """The names of one job's sink in one table."""

    job_id: str
    sink: str

    @property
    def owner(self) -> str:
        return hashlib.sha256(f"{self.job_id}\0{self.sink}".encode()).hexdigest()[:12]

    @property
    def folder(self) -> str:
        """The folder of this job's sink journals and staged rows."""
        return f"{ROOT}/{component(self.job_id)}/{component(self.sink)}"

    def epoch_folder(self, epoch: int) -> str:
        return f"{self.folder}/e{epoch:012d}"

    @staticmethod
    def folder_epoch(name: str) -> int | None:
        """The epoch of an epoch folder's name (`e<12 digits>`), None for any other name."""
        found = _EPOCH_FOLDER.match(name)
        return int(found.group(1)) if found else None

    def journal(self, name: ParticipantName) -> str:
        return f"{self.epoch_folder(name.epoch)}/{name.part}_g{name.generation}a{name.attempt}.json"

    def staged(self, name: ParticipantName, number: int) -> str:
        stem = f"{name.part}_g{name.generation}a{name.attempt}"
        return f"{self.epoch_folder(name.epoch)}/{stem}-{number:05d}.parquet"

    def data_file(
        self, name: ParticipantName, number: int, partition: Mapping[str, str | None], codec: str
    ) -> str:
        folders = "".join(f"{partition_folder(c, v)}/" for c, v in partition.items())
        return (
            f"{folders}part-{number:05d}-ds-{self.owner}-e{name.epoch}-{name.part}-"
            f"g{name.generation}a{name.attempt}.{codec}.parquet"
        )

    def owns(self, name: ParticipantName, path: str) -> bool:
        """Whether `path` (read back from a handle or a journal, which may be forged) is one of
        participant `name`'s files, relative to the table: a staged file of its own, or a data
        file named after it; never absolute, never a URI, never with `..`."""
        parts = path.split("/")
        if "\\" in path or any(p in ("", ".", "..") for p in parts):
            return False
        attempt = f"{name.part}_g{name.generation}a{name.attempt}-"
        if path.startswith(f"{self.epoch_folder(name.epoch)}/{attempt}"):
            return True
        tag = f"-ds-{self.owner}-e{name.epoch}-{name.part}-g{name.generation}a{name.attempt}."
        return parts[-1].startswith("part-") and tag in parts[-1]

    def parse_epoch_folder(self, relative: str) -> int | None:
        """The epoch of an epoch folder's path (`epoch_folder`), None for anything else."""
        parent, _, name = relative.rpartition("/")
        digits = name[1:]
        if parent != self.folder or name[:1] != "e" or len(digits) != 12 or not digits.isdigit():
            return None
        return int(digits)

    def parse_journal(self, relative: str) -> ParticipantName | None:
        """The participant a journal path names (None for anything else)."""
        prefix = self.folder + "/"
        if not relative.startswith(prefix):
            return None
        match = _JOURNAL.match(relative[len(prefix) :])
        if match is None:
            return None
        return ParticipantName.build(
            self.job_id,
            self.sink,
            int(match["epoch"]),
            match["part"],
            int(match["g"]),
            int(match["a"]),
        )


def partition_folder(column: str, value: str | None) -> str:
    """`<column>=<value>` when both are plain words, else a digest in their place (readers
    take partition values from the log, never from folder names)."""
    shown_column = column if _PLAIN.match(column) else "c" + _digest(column)
    if value is None:
        shown = "__HIVE_DEFAULT_PARTITION__"
    else:
        shown = value if _PLAIN.match(value) else "v" + _digest(value)
    return f"{shown_column}={shown}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
