"""The versions of what durable-sinks stores, and the one rule for reading them.

Everything durable-sinks stores outlives the process that wrote it (a decision record, a
commit handle, a progress record, an epoch marker, a table's layout...), so each stored
format carries a version and is declared once as a `StoredFormat`: its name, the version
this release writes (`current`) and the oldest version it reads (`oldest`, at most the
previous release's). `StoredFormat.check` is the rule every reader applies:

- a version in `oldest..current` is read (older ones turned into the current shape by the
  format's own reader);
- a newer version, or one older than `oldest`, is refused with a StoredFormatError naming
  the format, the version found, the versions this release reads and the fix (upgrade
  durable-sinks, or finish the job's in-doubt epochs with the release that wrote them);
- state written before its format carried a version reads as `unversioned` (version 1).

Every declared format is listed in `STORED_FORMATS` (docs/operations.md, "Stored formats", is
generated from it). Release rules (docs/operations.md, "Upgrading"): a patch release changes
no format and nothing that travels between processes, so releases of one MAJOR.MINOR run one
job together (`interoperate`); a minor release may add a format version and reads the
previous minor's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import CorruptRecordError, StoredFormatError

#: Every stored format declared so far, by name (a module declares its formats on import).
STORED_FORMATS: dict[str, StoredFormat] = {}

UPGRADE_FIX = (
    "upgrade durable-sinks to the release that wrote it (or newer) on the driver, the "
    "executors and the Spark Connect server, then restart the job: it finishes the epoch"
)
OLDER_FIX = (
    "upgrade one minor release at a time: restart the job once on the minor release in "
    "between (it finishes what is in doubt), then upgrade; see docs/operations.md, Upgrading"
)


@dataclass(frozen=True)
class StoredFormat:
    """One stored format: what it is, which versions this release writes and reads.

    `where` says where it is stored and where its version is kept (for the docs);
    `unversioned` is the version of state that carries none (written before the format
    carried a version)."""

    name: str
    current: int
    oldest: int
    where: str
    unversioned: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.oldest <= self.current:
            raise ValueError(f"{self.name}: reads versions {self.oldest}..{self.current}")

    @property
    def reads(self) -> str:
        """The versions this release reads, as the docs and messages write them."""
        if self.oldest == self.current:
            return f"version {self.current}"
        return f"versions {self.oldest} to {self.current}"

    def check(
        self,
        found: object,
        *,
        source: str,
        job: str | None = None,
        sink: str | None = None,
        epoch: int | None = None,
    ) -> int:
        """The version `found` (None: state that carries no version) if this release reads
        it. A version it does not read is a StoredFormatError, anything that is not a version
        a CorruptRecordError; both name `source` (the file, row, object or record read)."""
        if found is None:
            return self.unversioned
        if not isinstance(found, int) or isinstance(found, bool) or found < 1:
            raise CorruptRecordError(
                f"{source}: {self.name} version {found!r} is not a version",
                job=job,
                sink=sink,
                epoch=epoch,
                fix="the record was changed outside durable-sinks; restore it from a backup",
            )
        if self.oldest <= found <= self.current:
            return found
        if found > self.current:
            raise StoredFormatError(
                f"{source}: {self.name} version {found} was written by a newer release of "
                f"durable-sinks; this release reads {self.reads}. Nothing was changed.",
                job=job,
                sink=sink,
                epoch=epoch,
                fix=UPGRADE_FIX,
            )
        raise StoredFormatError(
            f"{source}: {self.name} version {found} was written by an older release of "
            f"durable-sinks; this release reads {self.reads}. Nothing was changed.",
            job=job,
            sink=sink,
            epoch=epoch,
            fix=OLDER_FIX,
        )


def stored_format(
    name: str, *, current: int, oldest: int, where: str, unversioned: int = 1
) -> StoredFormat:
    """Declare a stored format (once per name) and return it."""
    made = StoredFormat(name, current, oldest, where, unversioned)
    known = STORED_FORMATS.setdefault(name, made)
    if known != made:
        raise ValueError(f"stored format {name!r} declared twice, differently")
    return made


# -- releases that run together ------------------------------------------------------------------
_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.|$)")


def release_line(version: str) -> str:
    """`MAJOR.MINOR` of a release's version (`0.2` of `0.2.1`): releases of one line change no
    stored format and no pickled configuration, so they run together. A version that is not
    `MAJOR.MINOR...` is its own line."""
    found = _RELEASE.match(version)
    return f"{found[1]}.{found[2]}" if found else version


def interoperate(a: str, b: str) -> bool:
    """Whether releases `a` and `b` may run one job together (the driver, its executors, a
    Spark Connect server): the same MAJOR.MINOR, whatever their patch."""
    return release_line(a) == release_line(b)
