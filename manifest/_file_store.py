"""Decision store in a local (or any POSIX) directory.

Layout under `<path>/<job>/` (`<job>` as in participant names)::

    generations/<g>/decisions/<epoch>.json   where generation g's coordinator commits
    retired/<g>/                             generations fenced by a newer one (kept empty,
                                             the highest only, to remember the number)
    decisions/<epoch>.json                   every decided epoch (hard links)
    finished/<epoch>                         every participant of the epoch is committed
    latest, expired-below                    hints (lost in a crash: rebuilt by scanning)
    layout.json                              the layout's version (DIRECTORY_STORE)

The commit point of `put` is `link()` of the fsynced record into
`generations/<g>/decisions/`, by path. `open` of a newer generation first renames every older
`generations/<n>` away to `retired/<n>`: a link by a fenced coordinator then fails (the path no
longer exists) and it gets FencedError, while every link made before the rename is found under
`retired/<n>` and promoted into `decisions/`. Renames and links are atomic, so no decision can
slip between the fence and the promotion.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

from durable_sinks.core.durable_fs import (
    create_exclusive,
    fsync_dir,
    remove_tree,
    replace_atomically,
    write_durable_temp,
)
from durable_sinks.core.errors import (
    ConfigError,
    FencedError,
    InDoubtError,
    ManifestCorruptError,
    ManifestError,
    TransientError,
    UsageError,
)
from durable_sinks.core.formats import stored_format
from durable_sinks.core.naming import component
from durable_sinks.core.operations import Bookkeeping

from ._record import DecisionRecord
from ._store import logs_expire, logs_open, logs_put, require_open, require_own

_WIDTH = 12  # digits of epoch and generation numbers in file names (sortable)
#: A temporary file (`.tmp-*`: a record or hint being written) older than this is a crashed
#: writer's and is removed at `open`. A live writer links its temporary file within
#: milliseconds; one stalled longer finds it gone and stops (FencedError), nothing decided.
TEMP_AGE_S = 3600.0

LAYOUT_FILE = "layout.json"
LAYOUT_FORMAT = "durable-sinks/directory-store"
DIRECTORY_STORE = stored_format(
    "directory decision store layout",
    current=1,
    oldest=1,
    where=f'`<path>/<job>/{LAYOUT_FILE}`: `{{"format": "{LAYOUT_FORMAT}", "version": ...}}` '
    "(absent: version 1); its decision records carry their own",
)


def _epoch_file(epoch: int) -> str:
    return f"{epoch:0{_WIDTH}d}.json"


class LocalDirectoryStore:
    """A durable DecisionStore in a directory (fsync on by default).

    `path` may hold the records of many jobs. One instance serves one job, from `open` on.
    The directory must be on a local POSIX file system (hard links and atomic renames);
    network file systems without those guarantees are not supported.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._job: str | None = None
        self._home = Path()
        self._generation = -1
        self._own: Path = Path()  # generations/<g>/decisions
        self._own_fd: int | None = None

    @property
    def durable(self) -> bool:
        return self.fsync

    @property
    def generation(self) -> int:
        return self._generation

    def __repr__(self) -> str:
        return f"LocalDirectoryStore({str(self.path)!r}, job={self._job!r})"

    # -- generations ---------------------------------------------------------------------------
    @logs_open
    def open(self, job_id: str) -> int:
        if self._job is not None:
            raise UsageError(f"{self!r} is already open", job=job_id)
        self._job = job_id
        self._home = self.path / component(job_id)
        try:
            for sub in ("generations", "retired", "decisions", "finished"):
                (self._home / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot create the decision store under {self.path}: {exc.strerror}",
                job=job_id,
                fix="point the decision store at a writable local directory",
            ) from exc
        with self._io("open the job's folder"):
            self._check_layout()
            self._generation = self._claim_generation()
            self._retire_older()
            self._promote_retired()
            self._sweep_temps()
        return self._generation

    def _check_layout(self) -> None:
        """Record the layout's version in a job folder that has none (a new one, or one made
        before layouts carried a version: both version 1), then check it."""
        path = self._home / LAYOUT_FILE
        body = json.dumps({"format": LAYOUT_FORMAT, "version": DIRECTORY_STORE.current})
        with contextlib.suppress(FileExistsError):
            create_exclusive(path, body.encode() + b"\n", fsync=self.fsync)
        data = path.read_bytes()
        try:
            found = json.loads(data)
            if found.get("format") != LAYOUT_FORMAT:
                raise ValueError("format")  # noqa: TRY301 - one message for every damage
        except (ValueError, AttributeError) as exc:
            raise ManifestCorruptError(
                f"{path}: not a durable-sinks layout file ({len(data)} bytes)",
                job=self._job,
                fix=f"it was changed outside durable-sinks; write {body} there",
            ) from exc
        DIRECTORY_STORE.check(found.get("version"), source=str(path), job=self._job)

    def _sweep_temps(self) -> None:
        """Remove temporary files crashed writers left (older than TEMP_AGE_S), in the
        folders writers make them in: the job's folder (records, hints) and this
        generation's. `finished/` (one name per epoch: not listed at each open) gets none:
        its marks are created whole (`mark_finished`)."""
        old = time.time() - TEMP_AGE_S
        for folder in (self._home, self._own):
            for temp in folder.glob(".tmp-*"):
                with contextlib.suppress(OSError):
                    if temp.stat().st_mtime < old:
                        temp.unlink()

    @contextlib.contextmanager
    def _io(self, what: str, epoch: int | None = None) -> Iterator[None]:
        """A file-system failure (EIO, ENOSPC, EACCES, ...) not handled inside the block as
        TransientError naming it: never a raw OSError, never taken for a missing record."""
        try:
            yield
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            raise TransientError(
                f"the decision store could not {what} under {self.path}: "
                f"{name} {exc.strerror or exc}",
                job=self._job,
                epoch=epoch,
                fix="check the disk of the decision store's directory (free space, "
                "permissions, I/O errors in the kernel log); the job retries",
            ) from exc

    def _numbers(self, folder: str) -> list[int]:
        return [int(p.name) for p in (self._home / folder).iterdir() if p.name.isdigit()]

    def peek_generation(self, job_id: str) -> int:
        home = self.path / component(job_id)
        numbers = [
            int(p.name)
            for sub in ("generations", "retired")
            if (home / sub).is_dir()
            for p in (home / sub).iterdir()
            if p.name.isdigit()
        ]
        return max(numbers, default=0)

    def _claim_generation(self) -> int:
        while True:
            known = self._numbers("generations") + self._numbers("retired")
            generation = max(known, default=0) + 1
            mine = self._home / "generations" / f"{generation:0{_WIDTH}d}"
            try:
                mine.mkdir()
            except FileExistsError:
                continue  # another coordinator claimed it first: take the next one
            try:
                (mine / "decisions").mkdir()
            except FileNotFoundError:
                raise FencedError(
                    "a newer coordinator fenced this one while it was starting",
                    job=self._job,
                ) from None
            self._own = mine / "decisions"
            self._own_fd = os.open(self._own, os.O_RDONLY | os.O_DIRECTORY)
            # An abandoned store (a crashed or fenced coordinator) must not leak its descriptor.
            self._finalizer = weakref.finalize(self, _close_quietly, self._own_fd)
            if self.fsync:
                fsync_dir(mine)
                fsync_dir(self._home / "generations")
            return generation

    def _retire_older(self) -> None:
        generations, retired = self._home / "generations", self._home / "retired"
        for number in sorted(self._numbers("generations")):
            if number >= self._generation:
                continue
            name = f"{number:0{_WIDTH}d}"
            with contextlib.suppress(FileNotFoundError):  # retired by someone else already
                os.rename(generations / name, retired / name)
        if self.fsync:
            fsync_dir(generations)
            fsync_dir(retired)

    def _promote_retired(self) -> None:
        """Link every decision of retired generations into decisions/, then empty them,
        keeping only the highest retired folder (it remembers the generation number). The
        first open after a generation that decided n epochs costs O(n) (a link and an unlink
        each, about 0.1 ms); later opens find the retired folders empty."""
        retired = sorted(self._numbers("retired"))
        decisions = self._home / "decisions"
        promoted = False
        for number in retired:
            folder = self._home / "retired" / f"{number:0{_WIDTH}d}" / "decisions"
            if not folder.is_dir():
                continue
            for entry in folder.iterdir():
                if entry.name.startswith("."):
                    continue  # a temp file of a writer that was fenced mid-way
                try:
                    os.link(entry, decisions / entry.name)
                    promoted = True
                except FileExistsError:
                    # `put` links one file under both names: the same inode is the same
                    # record, read only when they differ (a generation's whole run is here).
                    if not os.path.samefile(entry, decisions / entry.name):
                        self._check_same(entry, decisions / entry.name)
        if promoted and self.fsync:
            fsync_dir(decisions)
        for number in retired:
            folder = self._home / "retired" / f"{number:0{_WIDTH}d}"
            remove_tree(folder / "decisions")
            if number != retired[-1]:
                remove_tree(folder)

    def _check_same(self, a: Path, b: Path) -> None:
        if a.read_bytes() != b.read_bytes():
            raise ManifestCorruptError(
                f"two different decisions for one epoch: {a} and {b}",
                job=self._job,
                fix="this cannot happen under the protocol; keep both files for diagnosis",
            )

    def _require_open(self) -> str:
        return require_open(self._job)

    # -- records -------------------------------------------------------------------------------
    @logs_put
    def put(self, record: DecisionRecord) -> DecisionRecord:
        job = self._require_open()
        require_own(record, job, self._generation)
        existing = self.get(record.epoch)
        if existing is not None:
            return existing
        name = _epoch_file(record.epoch)
        with self._io("write a decision", record.epoch):
            temp = write_durable_temp(self._home, record.to_bytes(), fsync=self.fsync)
        try:
            try:
                # The commit point. By path, so that a retired (renamed) folder is not found.
                os.link(temp, self._own / name)
            except FileNotFoundError:
                raise FencedError(
                    "a newer coordinator took over this job; this one's decision was not recorded",
                    job=job,
                    epoch=record.epoch,
                    fix="stop this coordinator; the newer one recovers the epoch",
                ) from None
            except FileExistsError:
                pass  # an earlier attempt of this put got this far
            except OSError as exc:  # EIO and the like: the link may or may not exist
                raise InDoubtError(
                    f"linking the decision failed ({exc}): it may or may not be recorded",
                    job=job,
                    epoch=record.epoch,
                    fix="nothing to do: the next attempt or the restart reads the decision back",
                ) from exc
            try:
                if self.fsync and self._own_fd is not None:
                    os.fsync(self._own_fd)  # by descriptor: works even if retired meanwhile
                try:
                    os.link(temp, self._home / "decisions" / name)
                except FileExistsError:
                    self._check_same(self._own / name, self._home / "decisions" / name)
            except OSError as exc:
                raise InDoubtError(
                    f"decision linked but not confirmed durable: {exc}",
                    job=job,
                    epoch=record.epoch,
                ) from exc
        finally:
            with contextlib.suppress(OSError):  # (a leftover is swept at a later open)
                os.unlink(temp)
        with contextlib.suppress(OSError):
            if record.epoch > (self._read_hint("latest") or -1):
                replace_atomically(self._home / "latest", str(record.epoch).encode())
        return record

    def get(self, epoch: int) -> DecisionRecord | None:
        self._require_open()
        path = self._home / "decisions" / _epoch_file(epoch)
        with self._io("read a decision", epoch):
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                own = self._own / _epoch_file(epoch)
                try:
                    data = own.read_bytes()  # linked here but not yet into decisions/
                except FileNotFoundError:
                    return None
                path = own
        return DecisionRecord.from_bytes(data, source=str(path))

    def mark_finished(self, epoch: int) -> None:
        # An empty file, created in one step: no temporary file in `finished/` to sweep.
        self._require_open()
        with self._io("mark an epoch finished", epoch), contextlib.suppress(FileExistsError):
            os.close(os.open(self._finished(epoch), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))

    def is_finished(self, epoch: int) -> bool:
        self._require_open()
        with self._io("read whether an epoch is finished", epoch):
            return self._finished(epoch).exists()

    def _finished(self, epoch: int) -> Path:
        return self._home / "finished" / f"{epoch:0{_WIDTH}d}"

    def latest_epoch(self) -> int | None:
        self._require_open()
        with self._io("find the latest decision"):
            return self._latest()

    def _latest(self) -> int | None:
        decisions = self._home / "decisions"
        hint = self._read_hint("latest")
        if hint is None or not (decisions / _epoch_file(hint)).exists():
            hint = max(self._decided_epochs(), default=None)
            if hint is None:
                return None
        while (decisions / _epoch_file(hint + 1)).exists():
            hint += 1
        return hint

    @logs_expire
    def expire(self, before_epoch: int) -> int:
        """Delete finished records of epochs below `before_epoch`, oldest first, stopping at
        the first unfinished one. Amortised O(1) per epoch: a watermark remembers where the
        last call stopped."""
        self._require_open()
        with self._io("expire old decisions"):
            return self._expire(before_epoch)

    def _expire(self, before_epoch: int) -> int:
        start = self._read_hint("expired-below")
        if start is None:  # first expiry in this folder: start at the oldest record, once
            start = min(self._decided_epochs(), default=max(before_epoch, 0))
            replace_atomically(self._home / "expired-below", str(start).encode())
        removed = 0
        epoch = start
        while epoch < before_epoch:
            decision = self._home / "decisions" / _epoch_file(epoch)
            if decision.exists() and not self.is_finished(epoch):
                break
            if decision.exists():
                removed += 1
            for path in (decision, self._own / _epoch_file(epoch), self._finished(epoch)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            epoch += 1
        if epoch != start:
            replace_atomically(self._home / "expired-below", str(epoch).encode())
        return removed

    def peek(self, job_id: str, epoch: int) -> DecisionRecord | None:
        home = self.path / component(job_id)
        name = _epoch_file(epoch)
        # decisions/ first; a record linked into its generation's folder but not yet into
        # decisions/ (a put under way, or cut short by a crash) counts too.
        for path in (
            home / "decisions" / name,
            *sorted(home.glob(f"generations/*/decisions/{name}")),
        ):
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            return DecisionRecord.from_bytes(data, source=str(path))
        return None

    def peek_latest(self, job_id: str) -> int | None:
        home = self.path / component(job_id)
        names = (p.name.removesuffix(".json") for p in (home / "decisions").glob("*.json"))
        return max((int(n) for n in names if n.isdigit()), default=None)

    def _decided_epochs(self) -> list[int]:
        """Every epoch with a record (a directory scan: only when hints are missing)."""
        names = (p.name.removesuffix(".json") for p in (self._home / "decisions").glob("*.json"))
        return [int(n) for n in names if n.isdigit()]

    def _read_hint(self, name: str) -> int | None:
        try:
            return int((self._home / name).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def drop_job(self, job_id: str, *, apply: bool) -> list[Bookkeeping]:
        """The job's folder `<path>/<job>/` (generations, decisions, finished marks, hints):
        counted, and with `apply` removed whole. The folder is the job's own by its name
        (`component(job_id)`, as every record of the job is found); a symbolic link there is
        refused, never followed."""
        home = self.path / component(job_id)
        if home.is_symlink():
            raise ManifestError(
                f"{home} is a symbolic link, not a folder the store made: refusing to remove it",
                job=job_id,
                fix=f"remove {home} by hand if it is the job's",
            )
        if not home.is_dir():
            return []
        with self._io("list the job's folder"):
            decisions = len(list((home / "decisions").glob("*.json")))
            files = sum(1 for _ in home.rglob("*"))
            if apply:
                remove_tree(home)
                if self.fsync:
                    fsync_dir(self.path)
        return [Bookkeeping(f"decision store folder ({decisions} decisions)", str(home), files)]

    def close(self) -> None:
        if self._own_fd is not None:
            self._finalizer()
            self._own_fd = None


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
