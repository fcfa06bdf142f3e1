"""Local file operations with stated durability, shared by the file sink and the file store.

POSIX gives three atomic, create-only publications on one file system: `link()` of a file,
`mkdir()`, and `renameat2(RENAME_NOREPLACE)` of a file or folder. What is published is durable
only once the folder that holds the new name is fsynced; these helpers do that.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import uuid
from pathlib import Path

_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_libc: ctypes.CDLL | None = None


def fsync_dir(path: Path) -> None:
    """Make the names inside `path` (creations, renames, deletions) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable_temp(folder: Path, data: bytes, *, fsync: bool = True) -> Path:
    """Write `data` to a new uniquely named hidden file in `folder` (content fsynced)."""
    temp = folder / f".tmp-{uuid.uuid4().hex}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return temp


def create_exclusive(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Publish a file with content `data` at `path` only if nothing is there yet.

    Readers never see a partial file: the content is written and fsynced under a temporary
    name, then linked to `path`. Raises FileExistsError (leaving the existing file untouched)
    when `path` exists. With `fsync`, the new name is durable when this returns.
    """
    temp = write_durable_temp(path.parent, data, fsync=fsync)
    try:
        os.link(temp, path)
    finally:
        os.unlink(temp)
    if fsync:
        fsync_dir(path.parent)


def probe_folder(folder: Path, name: str, *, fsync: bool = True) -> None:
    """Check that this process can create, write, link and delete files in `folder`, using
    the names `name` and `name + ".link"` only (removed again before returning). A process
    killed meanwhile leaves at most those two names behind: choose a name its owner will
    recognise and remove (nothing else is ever created). Raises OSError naming the failure."""
    path, link = folder / name, folder / f"{name}.link"
    for stale in (path, link):
        stale.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"probe")
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(path, link)
        link.unlink()
    finally:
        path.unlink()


def probe_as_owner(folder: Path, owner: str, generation: int, *, fsync: bool = True) -> None:
    """`probe_folder` under the name `<owner><generation>`, after removing the probes that
    older generations of the same owner left behind (a start killed while probing). The owner
    names the job and the sink, so one job never touches another's probes."""
    for stale in folder.glob(f"{owner}*"):
        generation_text = stale.name.removeprefix(owner).removesuffix(".link")
        if generation_text.isdigit() and int(generation_text) < generation:
            stale.unlink(missing_ok=True)
    probe_folder(folder, f"{owner}{generation}", fsync=fsync)


def replace_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` (readers see the old or the new content, never a mix).
    Not fsynced: for hints that may be lost in a crash."""
    temp = write_durable_temp(path.parent, data, fsync=False)
    os.replace(temp, path)


def rename_noreplace(source: Path, target: Path) -> None:
    """Rename `source` (file or folder) to `target` only if `target` does not exist.

    Atomic through renameat2(RENAME_NOREPLACE) on Linux; raises FileExistsError when the
    target exists. Where the call is unsupported (other kernels or file systems) it falls back
    to a check then rename, which is atomic only against processes that also use this function
    with the same protocol (one writer per target, as the coordinator guarantees).
    """
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is not None:
        result = renameat2(
            _AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE
        )
        if result == 0:
            return
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            raise FileExistsError(code, os.strerror(code), str(target))
        if code not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(code, os.strerror(code), str(source), None, str(target))
    if target.exists():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
    os.rename(source, target)


def remove_tree(path: Path) -> bool:
    """Delete a file or folder tree; True if something was there. Missing paths are fine."""
    if not path.exists() and not path.is_symlink():
        return False
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            remove_tree(child)
        with contextlib.suppress(FileNotFoundError):
            path.rmdir()
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return True
