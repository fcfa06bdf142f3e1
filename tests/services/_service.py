"""What every server of the test bed offers the command line and the pytest fixtures."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ._process import read_pid, stop_group, wait_ports_released


@dataclass(frozen=True)
class Status:
    """One server's state as `status` reports it. `detail` never holds a secret."""

    name: str
    running: bool
    pid: int | None
    detail: str
    logs: tuple[Path, ...]

    def line(self) -> str:
        state = (
            f"running (pid {self.pid})"
            if self.running and self.pid
            else ("ready" if self.running else "stopped")
        )
        return f"{self.name:<15} {state:<22} {self.detail}"


class Service(Protocol):
    """A server the project starts itself.

    `up` is idempotent: a server already running and healthy is left alone; it returns only
    once the server answers real requests. `down` leaves no process of the server behind.
    `reset` is `down` plus deleting the server's data (caches of downloaded jars are kept).
    """

    name: str

    def up(self) -> None: ...

    def down(self) -> None: ...

    def status(self) -> Status: ...

    def reset(self) -> None: ...


def remove_tree(path: Path) -> None:
    """Delete a folder of server data, whoever owns it (the Postgres cluster is the
    postgres user's)."""
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


class Daemon:
    """A server run as one detached process group recorded in a pid file (Kafka, SeaweedFS).

    Subclasses set `name`, `home`, `pid_file`, `stop_timeout` and say how to tell it answers.
    """

    name: str
    home: Path
    pid_file: Path
    stop_timeout: float = 30.0

    def ports(self) -> Mapping[str, int]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def describe(self) -> str:
        """Where clients reach it (no secrets)."""
        raise NotImplementedError

    def log_files(self) -> tuple[Path, ...]:
        raise NotImplementedError

    def pid(self) -> int | None:
        return read_pid(self.pid_file)

    def down(self) -> None:
        pid = self.pid()
        if pid is not None:
            stop_group(self.name, pid, timeout=self.stop_timeout)
            wait_ports_released(self.name, self.ports())
        self.pid_file.unlink(missing_ok=True)

    def reset(self) -> None:
        self.down()
        remove_tree(self.home)

    def status(self) -> Status:
        pid = self.pid()
        detail = self.describe()
        if pid is not None:
            detail += " (answering)" if self.ready() else " (NOT answering)"
        return Status(self.name, pid is not None, pid, detail, self.log_files())
