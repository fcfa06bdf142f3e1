"""The JSON Lines sink's options.

Every field is an option of `durable_sink("jsonl", ...)`: its annotation is the type the
registry checks before this class is even built (a misspelt name, a missing `path`, a string
given for `fsync` are refused there, with the closest name or the wanted type), and
`__post_init__` checks what a type cannot say. The class must stay picklable and hold no
client: it travels to executors, and the sink connects only in `open`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.naming import check_sink_name
from durable_sinks.core.settings import apply_conveniences


@dataclass(frozen=True)
class Jsonl:
    """Configuration of a JsonlSink: one JSON object per row and line, in ASCII (other
    characters escaped); timestamps and dates in ISO 8601, decimals as strings, bytes in
    base64."""

    kind: ClassVar[str] = "jsonl"

    path: str
    """Absolute path of the folder the sink writes to (created if missing), on a local POSIX
    file system; one sink of one job per folder. Layout:
    `epoch=<batch id>/part=<part>/rows.jsonl` plus `_EPOCH.json`; `_staging/` holds prepared
    batches. Required."""
    name: str = "jsonl"
    """The sink's name within the job (no `/`). Default "jsonl"."""
    fsync: bool = True
    """Make every file durable before the call that creates it returns. Default True; turn it
    off only for throwaway data: exactly-once then holds across process crashes, not machine
    crashes."""

    def __post_init__(self) -> None:
        apply_conveniences(self)
        if not self.path.strip():
            raise ConfigError("jsonl sink: `path` is empty", fix="give the folder's path")
        if not os.path.isabs(self.path):
            # A relative path is resolved against the current directory: a driver restarted
            # from another one would find neither its staged epochs nor its published ones.
            raise ConfigError(
                f"jsonl sink: path {self.path!r} is relative",
                sink=self.name,
                fix=f"give an absolute path, e.g. {os.path.abspath(self.path)!r}",
            )
        check_sink_name(self.name, "jsonl sink")
