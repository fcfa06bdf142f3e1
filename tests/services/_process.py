"""Processes, ports and waiting: what every service of the test bed needs to start and stop."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol


class ServiceError(RuntimeError):
    """A server of the test bed could not be started, reached or stopped.

    The message names the server, what went wrong and what to do; where a log exists its path
    and last lines are appended.
    """

    def __init__(self, service: str, problem: str, *, log: Path | None = None) -> None:
        message = f"{service}: {problem}"
        if log is not None:
            message += f"\n  log: {log}\n" + tail(log)
        super().__init__(message)
        self.service = service
        self.problem = problem
        self.log = log

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.service, self.problem), {"log": self.log})


def tail(path: Path, lines: int = 25) -> str:
    """The last lines of a log file, indented, or a note that it does not exist."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return "  (log file does not exist yet)"
    return "\n".join("  | " + line for line in text.splitlines()[-lines:])


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created with its folder if missing) across processes:
    pytest-xdist workers, the command line and fixtures serialise on it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class _HasHome(Protocol):
    name: str
    home: Path


def tests_lock(service: _HasHome) -> contextlib.AbstractContextManager[None]:
    """The lock held by whatever breaks `service` on purpose (a test that kills its nodes or
    executors, the soak) for as long as it does, and while a test session starts it: one test
    must not find a server another has just killed, nor start again what it killed."""
    return file_lock(service.home.parent / f"{service.name}.tests.lock")


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on host:port (a socket in TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_accepts(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """True when a TCP connection to host:port succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require_free_ports(service: str, ports: Mapping[str, int]) -> None:
    """Raise naming every port of `service` that another process already holds."""
    taken = {role: port for role, port in ports.items() if not port_is_free(port)}
    if taken:
        listing = ", ".join(f"{port} ({role})" for role, port in sorted(taken.items()))
        raise ServiceError(
            service,
            f"port {listing} on 127.0.0.1 is already in use by another process. Stop that "
            "process (`ss -ltnp` shows which), or move the test bed to other ports with the "
            "DS_*_PORT variables listed in docs/testbed.md.",
        )


def wait_ports_released(service: str, ports: Mapping[str, int], timeout: float = 30.0) -> None:
    """After a stop, wait until no socket listens on any of the server's ports."""
    wait_until(
        service,
        lambda: all(port_is_free(p) for p in ports.values()),
        timeout=timeout,
        what=f"ports {sorted(ports.values())} to be released after stopping",
    )


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat(Path(f"/proc/{pid}/stat"))
    if not fields:
        return False
    # Field 3, the first after the command name, is the state; Z is a zombie. A leader
    # shows Z while its other threads still exit (and still hold its sockets): count those.
    if fields[0] != "Z":
        return True
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def process_start(pid: int) -> int | None:
    """When the process `pid` started (clock ticks after boot, field 22 of /proc/<pid>/stat),
    None when there is no such process: with the pid, what tells a server from a later
    process the kernel gave the same pid after the server died."""
    fields = _stat(Path(f"/proc/{pid}/stat")) or []
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def _stat(path: Path) -> list[str] | None:
    """The fields of a process's `/proc/<pid>/stat` after its parenthesised command name
    (field 3, the state, first), None when the process is gone."""
    try:
        return path.read_text().rpartition(")")[2].split()
    except OSError:
        return None


def read_pid(pid_file: Path) -> int | None:
    """The pid recorded in pid_file when that process is still alive, else None. A file that
    also records the process's start time (`start_daemon`'s) names that process only: a
    live process with the same pid and another start time is someone else, who got the pid
    after the server died without removing its file (a machine up for long reuses pids)."""
    try:
        recorded = pid_file.read_text().split()
        pid = int(recorded[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None
    if len(recorded) > 1 and recorded[1].isdigit() and process_start(pid) != int(recorded[1]):
        return None
    return pid if pid_alive(pid) else None


def start_daemon(
    argv: Sequence[str],
    *,
    log: Path,
    pid_file: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> int:
    """Start argv detached (own session, stdin from /dev/null, output appended to log).

    The child never inherits the caller's terminal or pipes, so a CI runner that waits for its
    script's output to close is not held open by a server left running.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
    started = process_start(proc.pid)
    pid_file.write_text(f"{proc.pid}" + ("" if started is None else f" {started}") + "\n")
    return proc.pid


def stop_group(service: str, pid: int, *, timeout: float = 30.0) -> None:
    """SIGTERM the process group led by pid, wait, then SIGKILL whatever is left."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pid)
            if not pid_alive(pid) and not _group_alive(pid):
                return
            time.sleep(0.1)
    raise ServiceError(
        service,
        f"process group {pid} survived SIGTERM and SIGKILL: "
        f"{group_members(pid)} still run; kill them by hand",
    )


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(pid_alive(p) for p in group_members(pgid))


def group_members(pgid: int) -> list[int]:
    """Pids of live processes whose process group is pgid."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(entry / "stat")
        if fields is not None and len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def descendants(pid: int) -> list[int]:
    """Pids of the live processes below pid (children, their children, ...), whatever their
    process group: a server's helpers that made a group of their own (PySpark's worker
    daemon does) are still its descendants until it dies and they are re-parented."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(entry / "stat")
        if fields is not None and len(fields) > 1 and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, ()))
    return found


def process_group(pid: int) -> int | None:
    """The process group of pid, or None when it is gone."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def wait_until(
    service: str,
    ready: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    log: Path | None = None,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Poll `ready` until it returns True; raise ServiceError on time-out or early death."""
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        if alive is not None and not alive():
            raise ServiceError(service, f"the process exited while waiting for {what}", log=log)
        if time.monotonic() > deadline:
            raise ServiceError(service, f"{what} did not happen within {timeout:.0f} s", log=log)
        time.sleep(0.2)


def run(
    service: str,
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    fix: str = "",
) -> str:
    """Run a set-up command to completion; raise ServiceError with its output if it fails."""
    try:
        done = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise ServiceError(service, f"`{argv[0]}` is not installed. {fix}".rstrip()) from None
    except subprocess.TimeoutExpired:
        raise ServiceError(
            service, f"`{' '.join(argv)}` took longer than {timeout:.0f} s"
        ) from None
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip().splitlines()[-30:]
        raise ServiceError(
            service,
            f"`{' '.join(argv)}` failed with exit code {done.returncode}. {fix}".rstrip()
            + "\n"
            + "\n".join("  | " + line for line in output),
        )
    return done.stdout
