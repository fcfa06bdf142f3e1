"""One data object written as an S3 multipart upload, as the Parquet writer produces it.

`ObjectUpload` is the file the Parquet writer writes into: bytes gather in a buffer of
`part_size_bytes` and each full buffer is uploaded as the next part. Requests run on a small
per-process thread pool so that they overlap the encoding: the upload is created
(CreateMultipartUpload) while the first row group is being encoded, and a full part is
uploaded while the next one fills, at most one part in flight, so memory stays at about two
parts however large the object grows. The SHA-256 of each part is computed while the part is
on its way. `finish()` uploads what is left (the Parquet footer and the tail, which may be
smaller than 5 MiB: S3 allows that for the last part), waits for every request and returns
what completing the upload needs: the upload id and the parts' ETags. Nothing is visible until
the upload is completed (S3Sink.commit_epoch).

A request that failed is raised, translated, by the next call that needs its result
(`write` of the next part, `finish`, `upload_id`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from durable_sinks.clients.s3 import multipart_etag
from durable_sinks.core.errors import DurableSinkError
from durable_sinks.core.threads import process_pool

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: Metadata every data object carries: the participant that wrote it, so that an object found
#: complete can be told apart from another attempt's (its key says the same, its upload id
#: is gone once completed).
PARTICIPANT_METADATA = "ds-participant"
CONTENT_TYPE = "application/vnd.apache.parquet"
#: Threads running upload requests, per process (each upload has at most two requests in
#: flight: its creation, then one part).
POOL_THREADS = 4

Failure = Callable[[BaseException, str], DurableSinkError]


def _pool() -> ThreadPoolExecutor:
    """This process's request threads."""
    return process_pool("durable-sinks-s3", POOL_THREADS)


class ObjectUpload:
    """A multipart upload in progress, as a write-only binary file."""

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        key: str,
        participant: str,
        part_size_bytes: int,
        fail: Failure,
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.key = key
        self.participant = participant
        self.part_size_bytes = part_size_bytes
        self._fail = fail
        self.etags: list[str] = []
        self.rows = 0
        self.size = 0
        self._buffer = bytearray()
        self._digest = hashlib.sha256()
        self._closed = False
        self._parts = 0
        self._in_flight: tuple[int, Future[str]] | None = None
        self._created = _pool().submit(self._create)

    def _create(self) -> str:
        created = self.client.create_multipart_upload(
            Bucket=self.bucket,
            Key=self.key,
            ContentType=CONTENT_TYPE,
            Metadata={PARTICIPANT_METADATA: self.participant},
        )
        return created["UploadId"]

    @property
    def upload_id(self) -> str:
        """The upload's id, once the server has created it (waits for it)."""
        try:
            return self._created.result()
        except Exception as exc:
            raise self._fail(
                exc, f"start the multipart upload of s3://{self.bucket}/{self.key}"
            ) from exc

    def started(self) -> str | None:
        """The upload's id if it was created, None if its creation failed: for an abort, which
        has nothing to do then. Waits for requests in flight, whose failures do not matter
        to an upload about to be aborted."""
        if self._in_flight is not None:
            self._in_flight[1].exception()
            self._in_flight = None
        if self._created.exception() is not None:
            return None
        return self._created.result()

    # -- the file the Parquet writer writes into -------------------------------------------------
    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._buffer += view
        self.size += len(view)
        if len(self._buffer) >= self.part_size_bytes:
            self._upload_buffer()
        return len(view)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        return None

    def close(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    # -- the upload --------------------------------------------------------------------------
    def _upload_buffer(self) -> None:
        """Send the buffer as the next part, after the part before it has arrived (its ETag
        kept); hash it while it travels."""
        self._settle()
        body = bytes(self._buffer)
        self._buffer.clear()
        self._parts += 1
        upload_id = self.upload_id
        number = self._parts
        sent = _pool().submit(self._upload_part, upload_id, number, body)
        self._in_flight = (number, sent)
        self._digest.update(body)  # hashlib lets go of the GIL: this overlaps the request

    def _upload_part(self, upload_id: str, number: int, body: bytes) -> str:
        answer = self.client.upload_part(
            Bucket=self.bucket, Key=self.key, UploadId=upload_id, PartNumber=number, Body=body
        )
        return answer["ETag"]

    def _settle(self) -> None:
        """Wait for the part in flight; its ETag, or its failure raised."""
        if self._in_flight is None:
            return
        (number, sent), self._in_flight = self._in_flight, None
        try:
            self.etags.append(sent.result())
        except Exception as exc:
            raise self._fail(exc, f"upload part {number} of s3://{self.bucket}/{self.key}") from exc

    def finish(self) -> dict[str, Any]:
        """Upload the tail as the last part and wait for every part; the object's description
        for the commit handle (bucket-relative key, upload id, part ETags, size, rows, SHA-256
        of its bytes)."""
        if self._buffer or not self._parts:
            self._upload_buffer()
        self._settle()
        return {
            "key": self.key,
            "upload_id": self.upload_id,
            "etags": list(self.etags),
            "etag": multipart_etag(self.etags),
            "size": self.size,
            "rows": self.rows,
            "sha256": self._digest.hexdigest(),
        }
