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
class JsonlSinkConfig:
    """Configuration of a JsonlSink.

    - path: absolute path of the folder the sink writes to (created if missing), on a local
      POSIX file system. One sink of one job per folder.
    - name: the sink's name within the job.
    - fsync: make every file durable before the call that creates it returns. Turn it off
      only for throwaway data: exactly-once then holds across process crashes, not across
      machine crashes.
    """

    kind: ClassVar[str] = "jsonl"

    path: str
    name: str = "jsonl"
    fsync: bool = True

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
