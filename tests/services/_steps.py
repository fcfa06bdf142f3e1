"""Set-up steps: what the test bed downloads, builds or generates once and then reuses (Maven
classpaths, the Toxiproxy binary, the TLS material, a Postgres cluster's data folder).

Servers start in parallel threads (`python -m tests.services up`) and in parallel processes
(pytest-xdist workers, a second checkout sharing the cache), so two of them often need the same
step at the same moment, most of all on a fresh machine where nothing is built yet.
`ensure_folder` gives every step the same contract:

- **once**: at most one build of a target runs at a time, across threads and processes (an
  exclusive `flock` on a lock file beside the target; each call opens its own descriptor, so
  threads of one process exclude each other too). Whoever waited re-checks and takes the
  published result instead of building again.
- **atomic**: the build writes into a fresh staging folder (`.<name>.partial-<random>`); the
  folder is published by one `rename` (atomic within a file system) only after the build
  returned and the completion marker was written inside it. A reader trusts a target only with
  its marker.
- **killed half-way**: the kernel drops a dead holder's lock; what it left is a staging folder
  no reader trusts, which the next builder deletes before building again.
- **named failures**: a failing build raises `SetupStepError` naming the service that asked,
  the step and the cause (with the file name of an `OSError`); nothing is published, and the
  next call builds again. Waiting longer than `wait_timeout` for another builder fails the
  same way, naming the process that holds the step.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from durable_sinks.core.durable_fs import fsync_dir, fsync_file

from ._process import ServiceError

#: The file inside a published folder that says it is complete (written last, before rename).
COMPLETE = ".complete"
#: How long a caller waits for another process's build of the same step by default: Maven's
#: first resolution of Spark's extra jars takes minutes on a slow mirror.
WAIT_TIMEOUT = 1800.0


class SetupStepError(ServiceError):
    """A set-up step failed or could not be waited for: names the service that needed it,
    the step and the cause. Nothing of the failed attempt is trusted afterwards."""

    def __init__(self, service: str, step: str, cause: str) -> None:
        super().__init__(service, f"set-up step {step!r} failed: {cause}")
        self.step = step
        self.cause = cause

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.service, self.step, self.cause))


def describe(exc: BaseException) -> str:
    """An exception as one readable line: its type and message (an `OSError`'s message names
    its file: `FileNotFoundError: [Errno 2] No such file or directory: '/x'`)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.contextmanager
def step_lock(
    service: str, step: str, lock_file: Path, *, wait_timeout: float = WAIT_TIMEOUT
) -> Iterator[None]:
    """Hold the step's exclusive lock (threads and processes alike); the holder's pid and step
    are written into the lock file so that a waiter that gives up can name it."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a+") as handle:
        deadline = time.monotonic() + wait_timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.seek(0)
                    holder = handle.read().strip() or "an unknown process"
                    raise SetupStepError(
                        service,
                        step,
                        f"waited {wait_timeout:.0f} s for {holder} to finish it; if that "
                        f"process is gone or stuck, stop it and remove {lock_file}",
                    ) from None
                time.sleep(0.1)
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} ({step})\n")
            handle.flush()
            yield
        finally:
            with contextlib.suppress(OSError):
                handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


def is_complete(target: Path) -> bool:
    """Whether `target` was published by `ensure_folder` (its marker is there)."""
    return (target / COMPLETE).is_file()


def ensure_folder(
    service: str,
    step: str,
    target: Path,
    build: Callable[[Path], object],
    *,
    wait_timeout: float = WAIT_TIMEOUT,
) -> Path:
    """The folder `target`, built by `build(staging)` at most once (see the module docs).

    `build` fills the empty folder it is given; its exceptions become `SetupStepError` (a
    `ServiceError` it raises keeps its own message, prefixed by the step). `target` must not
    be written by anything else: it is replaced whole when it lacks the marker.
    """
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with step_lock(
        service, step, target.parent / f".{target.name}.lock", wait_timeout=wait_timeout
    ):
        if is_complete(target):
            return target  # another thread or process built it while we waited
        _remove_leftovers(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        try:
            build(staging)
            (staging / COMPLETE).write_text(f"{step}\n")
            _fsync_tree(staging)
            staging.rename(target)
            fsync_dir(target.parent)
        except ServiceError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise SetupStepError(service, step, exc.problem) from exc
        except Exception as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise SetupStepError(service, step, describe(exc)) from exc
    return target


def publish_file(target: Path, text: str, *, mode: int = 0o644) -> str:
    """Create the small file `target` with `text`, whole or not at all, unless it exists; return
    what `target` holds. Written to a temporary file, synced, then linked to its name
    (`link` fails when the name exists: the first file published wins, and a process killed
    half-way leaves only a temporary file, never a half-written `target`)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(temporary, target)
            fsync_dir(target.parent)
    finally:
        os.unlink(temporary)
    return target.read_text()


def _remove_leftovers(target: Path) -> None:
    """Under the step's lock: delete an incomplete `target` and staging folders of builds
    that died (no other build of this target can be running)."""
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    for partial in target.parent.glob(f".{target.name}.partial-*"):
        shutil.rmtree(partial, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    """Make the staged files durable before the rename publishes them: a machine that loses
    power right after must not find a marked folder with empty files."""
    for path in sorted(folder.rglob("*"), reverse=True):
        if path.is_file() and not path.is_symlink():
            fsync_file(path)
        elif path.is_dir():
            fsync_dir(path)
    fsync_dir(folder)
