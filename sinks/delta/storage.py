"""The table's folder as the Delta sink reads and writes it: a local folder or an S3 prefix,
behind pyarrow's filesystems, and the same place as delta-rs's storage options.

Durability: a file is durable once `write` returns (local files are fsynced with their
folder; an S3 object exists only once its upload completed). `delete` of a missing file is a
no-op, so every cleanup may be repeated.
"""

from __future__ import annotations

import errno
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from durable_sinks.core.durable_fs import fsync_dir, fsync_file
from durable_sinks.core.errors import ConfigError, DurableSinkError, TransientError
from durable_sinks.core.secrets import resolve_settings

from .config import Delta

if TYPE_CHECKING:
    from pyarrow import fs

#: Words of pyarrow's S3 errors that no retry can fix, with the fix.
_REFUSED = {
    "ACCESS_DENIED": "grant the job's identity the S3 actions listed in docs/delta.md",
    "AccessDenied": "grant the job's identity the S3 actions listed in docs/delta.md",
    "InvalidAccessKeyId": "check the access key id",
    "SignatureDoesNotMatch": "check the secret access key and the region",
    "NoSuchBucket": "create the bucket first (durable-sinks never creates buckets)",
    "NO_SUCH_BUCKET": "create the bucket first (durable-sinks never creates buckets)",
    "certificate": "set SSL_CERT_FILE to a PEM file of the CAs that signed the server's "
    "certificate (driver and executors)",
}


#: Bytes of a file being written for S3 kept in memory before the spool moves to disk.
SPOOL_IN_MEMORY = 16 * 1024 * 1024


#: Keys per DeleteObjects request (S3 takes at most 1,000).
DELETE_BATCH = 1_000


@dataclass(frozen=True)
class Listed:
    """A file under the table's folder: its path relative to the folder, and its size."""

    path: str
    size: int


class TableStorage:
    """Files under one table's folder, by paths relative to it (`/`-separated)."""

    def __init__(self, config: Delta) -> None:
        self.config = config
        self._filesystem: fs.FileSystem | None = None

    @property
    def where(self) -> str:
        return self.config.path.rstrip("/")

    @property
    def table_uri(self) -> str:
        """The table's URI for delta-rs."""
        if self.config.on_s3:
            return str(self.config.location)
        return self.config.local_path

    def storage_options(self) -> dict[str, str]:
        """delta-rs's storage options: the S3 connection's settings (secrets resolved here,
        never stored) and the user's own `storage_options`."""
        options: dict[str, str] = {}
        if self.config.on_s3:
            connection = self.config.connection
            settings = {
                "AWS_ENDPOINT_URL": connection.endpoint_url,
                "AWS_REGION": connection.region,
                "AWS_ACCESS_KEY_ID": connection.access_key_id,
                "AWS_SECRET_ACCESS_KEY": connection.secret_access_key,
                "AWS_SESSION_TOKEN": connection.session_token,
            }
            options = {k: v for k, v in settings.items() if v is not None}
            if (connection.endpoint_url or "").startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
            if connection.addressing_style == "virtual":
                options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "true"
            options["timeout"] = f"{math.ceil(connection.request_timeout_s)}s"
            options["connect_timeout"] = f"{math.ceil(connection.connect_timeout_s)}s"
        options.update(self.config.storage_options or {})
        return resolve_settings(options, f"delta sink {self.config.name!r}")

    def filesystem(self) -> fs.FileSystem:
        if self._filesystem is None:
            self._filesystem = self._build()
        return self._filesystem

    def _build(self) -> fs.FileSystem:
        from pyarrow import fs

        if not self.config.on_s3:
            return fs.LocalFileSystem()
        # No tls_ca_file_path: a Delta sink refuses ca_bundle (its config says why).
        return fs.S3FileSystem(**self.config.connection.arrow_settings())

    def full_path(self, relative: str) -> str:
        if self.config.on_s3:
            location = self.config.location
            return f"{location.bucket}/{location.key(relative)}"
        return f"{self.config.local_path}/{relative}"

    # -- files ---------------------------------------------------------------------------------
    @contextmanager
    def writing(self, relative: str) -> Iterator[BinaryIO]:
        """A stream that becomes the file `relative` once the block ends without error (and
        durable: see the module docs). On an error the partial file is removed.

        On S3 the bytes are spooled here (memory, then a temporary file) and uploaded when
        the block ends: a writer that is abandoned or dies never makes an object, where a
        streaming upload would complete whenever its stream is closed, even by a zombie
        long after recovery cleaned up."""
        if self.config.on_s3:
            yield from self._spooled(relative)
            return
        full = Path(self.full_path(relative))
        full.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.filesystem().open_output_stream(str(full)) as stream:
                yield stream
        except BaseException:
            self.delete([relative])
            raise
        fsync_file(full)
        fsync_dir(full.parent)

    def _spooled(self, relative: str) -> Iterator[BinaryIO]:
        location = self.config.location
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
            yield spool  # type: ignore[misc]
            spool.seek(0)
            self.config.connection.client().upload_fileobj(
                spool, location.bucket, location.key(relative)
            )

    def write_bytes(self, relative: str, data: bytes) -> None:
        with self.writing(relative) as stream:
            stream.write(data)

    def read_bytes(self, relative: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        try:
            with self.filesystem().open_input_stream(self.full_path(relative)) as stream:
                data: bytes = stream.read()
        except FileNotFoundError:
            return None
        return data

    def delete(self, relatives: list[str]) -> None:
        """Delete the files (missing ones are skipped); empty local folders stay. On S3,
        the files go in DeleteObjects requests of up to DELETE_BATCH keys each (named keys
        only: nothing else under their folder is touched; pyarrow's own deletion would leave
        an empty marker object for a folder whose last file it deletes, one more name in
        every later listing of the journals)."""
        if self.config.on_s3:
            self._delete_on_s3(relatives)
            return
        filesystem = self.filesystem()
        for relative in relatives:
            try:
                filesystem.delete_file(self.full_path(relative))
            except FileNotFoundError:
                continue

    def _delete_on_s3(self, relatives: list[str]) -> None:
        location = self.config.location
        client = self.config.connection.client()
        for start in range(0, len(relatives), DELETE_BATCH):
            keys = [location.key(r) for r in relatives[start : start + DELETE_BATCH]]
            answer = client.delete_objects(
                Bucket=location.bucket,
                Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True},
            )
            failed = [e for e in answer.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if failed:
                first = failed[0]
                raise OSError(
                    f"could not delete s3://{location.bucket}/{first.get('Key')}: "
                    f"{first.get('Code')} {first.get('Message')} "
                    f"({len(failed)} of {len(keys)} keys failed)"
                )

    def folders(self, folder: str) -> list[str]:
        """`folder` (relative) and every folder under it, deepest first, when they exist; none
        on S3, which has no folders."""
        if self.config.on_s3:
            return []
        top = Path(self.full_path(folder))
        if top.is_symlink() or not top.is_dir():
            return []
        found = [p for p in top.rglob("*") if p.is_dir() and not p.is_symlink()]
        found.sort(key=lambda p: len(p.parts), reverse=True)
        root = Path(self.full_path(""))
        return [str(p.relative_to(root)) for p in [*found, top]]

    def subfolders(self, folder: str) -> list[str]:
        """The folders directly in `folder` (relative; symbolic links left out); none on S3,
        which has no folders."""
        if self.config.on_s3:
            return []
        top = Path(self.full_path(folder))
        root = Path(self.full_path(""))
        try:
            with os.scandir(top) as entries:
                return [
                    str((top / e.name).relative_to(root))
                    for e in entries
                    if e.is_dir(follow_symlinks=False)
                ]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def inside(self, relative: str, folder: str) -> bool:
        """Whether the file `relative` lies in `folder` without passing a symbolic link (a
        local table's; on S3 the key's text says it)."""
        if self.config.on_s3:
            return True
        top = Path(self.full_path(folder))
        path = Path(self.full_path(relative))
        if not path.is_relative_to(top):
            return False
        return not any(p.is_symlink() for p in [path, *path.parents] if p.is_relative_to(top))

    def children(self, folder: str) -> list[str]:
        """The names of the local folders directly inside `folder` (relative), symbolic links
        left out; none on S3, or when `folder` does not exist."""
        if self.config.on_s3:
            return []
        top = Path(self.full_path(folder))
        if top.is_symlink() or not top.is_dir():
            return []
        return [p.name for p in top.iterdir() if p.is_dir() and not p.is_symlink()]

    def remove_empty_folder(self, relative: str) -> bool:
        """Remove the local folder `relative` if it is empty; False when it holds something
        (or is gone already)."""
        try:
            Path(self.full_path(relative)).rmdir()
        except (FileNotFoundError, FileExistsError):
            return False
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY:
                return False
            raise
        return True

    def list(self, folder: str) -> list[Listed]:
        """Every file under `folder` (relative; recursively), missing folder = none."""
        from pyarrow import fs

        base = self.full_path(folder).rstrip("/")
        selector = fs.FileSelector(base, recursive=True, allow_not_found=True)
        root = self.full_path("").rstrip("/") + "/"
        return sorted(
            (
                Listed(info.path[len(root) :], int(info.size or 0))
                for info in self.filesystem().get_file_info(selector)
                if info.type == fs.FileType.File
            ),
            key=lambda listed: listed.path,
        )

    def exists(self, relative: str) -> bool:
        from pyarrow import fs

        info = self.filesystem().get_file_info(self.full_path(relative))
        return bool(info.type == fs.FileType.File)

    # -- errors --------------------------------------------------------------------------------
    def failure(
        self, exc: BaseException, action: str, made: Callable[..., DurableSinkError]
    ) -> DurableSinkError:
        """What a storage error means: a ConfigError with its fix for a refusal no retry can
        change, a TransientError otherwise. `made(cls, text, fix)` adds job/sink/epoch."""
        if isinstance(exc, DurableSinkError):
            return exc
        text = f"could not {action} under {self.where}: {type(exc).__name__}: {exc}"
        for word, fix in _REFUSED.items():
            if word in str(exc):
                return made(ConfigError, text, fix)
        if isinstance(exc, PermissionError):
            return made(ConfigError, text, "let the job's user write to the table's folder")
        return made(TransientError, text, None)
