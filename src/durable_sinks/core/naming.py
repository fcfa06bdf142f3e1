"""Deterministic participant names: `ds:<job>:<sink>:<epoch>:<part>:<attempt>`.

Every prepared participant (a Postgres gid, a staging folder, a multipart upload) is named so
that recovery can find what a job owns and to which epoch and attempt it belongs, from the name
alone. Names are at most 199 bytes (Postgres's gid limit) and use only `[A-Za-z0-9._-]` between
the colons: a job or sink name that is longer than 40 characters or has other characters is
replaced by `h-` and 16 hex digits of its SHA-256, which stays unique and parseable.

`attempt` is `<generation>-<n>`: the coordinator generation that made the participant and a
counter of that generation's attempts at the epoch, so two attempts never share a name.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from .errors import ConfigError

PREFIX = "ds"
MAX_BYTES = 199
_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,40}$")
_ATTEMPT = re.compile(r"^(\d+)-(\d+)$")


def check_sink_name(name: object, where: str) -> None:
    """Refuse a sink name that is empty, `.` or `..`, or holds a path separator or a control
    character (ConfigError): names may reach folders and keys (as participant names, through
    `component`), and must read plainly in messages."""
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or "\\" in name
        or any(ord(c) < 32 or ord(c) == 127 for c in name)
    ):
        raise ConfigError(
            f"{where}: invalid name {name!r}",
            fix="name the sink with a plain word (letters, digits, '-', '_', '.')",
        )


def component(name: str) -> str:
    """The form of a job or sink name used inside participant names."""
    if _SAFE.match(name) and not name.startswith("h-"):
        return name
    return "h-" + hashlib.sha256(name.encode()).hexdigest()[:16]


@dataclass(frozen=True, order=True)
class ParticipantName:
    """One participant's identity. `str()` gives the stored form; `parse` reads it back."""

    job: str  # already in `component` form
    sink: str  # already in `component` form
    epoch: int
    part: str
    generation: int
    attempt: int

    @classmethod
    def build(
        cls, job_id: str, sink: str, epoch: int, part: str, generation: int, attempt: int
    ) -> ParticipantName:
        if epoch < 0 or generation < 0 or attempt < 0:
            raise ValueError("epoch, generation and attempt must be >= 0")
        if not _SAFE.match(part):
            raise ValueError(f"part {part!r} must match [A-Za-z0-9._-]{{1,40}}")
        name = cls(component(job_id), component(sink), epoch, part, generation, attempt)
        if len(str(name).encode()) > MAX_BYTES:  # pragma: no cover - bounded by construction
            raise ValueError(f"participant name longer than {MAX_BYTES} bytes: {name}")
        return name

    def __str__(self) -> str:
        return (
            f"{PREFIX}:{self.job}:{self.sink}:{self.epoch}:{self.part}:"
            f"{self.generation}-{self.attempt}"
        )

    @classmethod
    def parse(cls, text: str) -> ParticipantName | None:
        """The name `text` stands for, or None when it is not a participant name (e.g. a
        foreign gid): recovery ignores what it cannot parse instead of crashing."""
        fields = text.split(":")
        if len(fields) != 6 or fields[0] != PREFIX:
            return None
        _, job, sink, epoch, part, attempt = fields
        match = _ATTEMPT.match(attempt)
        if not (match and epoch.isdigit() and _SAFE.match(job) and _SAFE.match(sink)):
            return None
        if not _SAFE.match(part):
            return None
        return cls(job, sink, int(epoch), part, int(match.group(1)), int(match.group(2)))

    def owned_by(self, job_id: str, sink: str) -> bool:
        return self.job == component(job_id) and self.sink == component(sink)

    @property
    def slice(self) -> str:
        """The slice of the epoch's data the participant's part writes: the part's text before
        its first '-' (`p3` of executor mode's `p3-t17`). Attempts at one slice (a Spark
        partition) share it; two parts of one epoch with different slices write different
        rows."""
        return self.part.split("-", 1)[0]

    def sibling_of(self, other: ParticipantName) -> bool:
        """Whether `other` is another slice of the same epoch, sink and generation: a part
        whose rows the driver's decision commits together with this one's."""
        return (self.job, self.sink, self.epoch, self.generation) == (
            other.job,
            other.sink,
            other.epoch,
            other.generation,
        ) and self.slice != other.slice


def job_prefix(job_id: str) -> str:
    """Every participant name of the job, of any sink, starts with this."""
    return f"{PREFIX}:{component(job_id)}:"


def owner_prefix(job_id: str, sink: str) -> str:
    """Every participant name of (job, sink) starts with this, e.g. for `LIKE 'prefix%'`."""
    return f"{job_prefix(job_id)}{component(sink)}:"
