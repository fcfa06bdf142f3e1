"""What every server of the test bed offers the command line and the pytest fixtures."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


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
        return f"{self.name:<9} {state:<22} {self.detail}"


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
