"""One data object written as an S3 multipart upload, as the Parquet writer produces it.

`ObjectUpload` is the file the Parquet writer writes into: bytes gather in a buffer of
`part_size_bytes` and each full buffer is uploaded as the next part, so memory stays at about one
part however large the object grows. `finish()` uploads what is left (the Parquet footer and
the tail, which may be smaller than 5 MiB: S3 allows that for the last part) and returns what
completing the upload needs: the upload id and the parts' ETags. Nothing is visible until the
upload is completed (S3Sink.commit_epoch).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durable_sinks.core.errors import DurableSinkError
from durable_sinks.core.s3 import multipart_etag

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: Metadata every data object carries: the participant that wrote it, so that an object found
#: complete can be told apart from another attempt's (its key says the same, its upload id
#: is gone once completed).
PARTICIPANT_METADATA = "ds-participant"
CONTENT_TYPE = "application/vnd.apache.parquet"

Failure = Callable[[BaseException, str], DurableSinkError]


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
        try:
            created = client.create_multipart_upload(
                Bucket=bucket,
                Key=key,
                ContentType=CONTENT_TYPE,
                Metadata={PARTICIPANT_METADATA: participant},
            )
        except Exception as exc:
            raise fail(exc, f"start the multipart upload of s3://{bucket}/{key}") from exc
        self.upload_id: str = created["UploadId"]

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
        body = bytes(self._buffer)
        self._buffer.clear()
        number = len(self.etags) + 1
        self._digest.update(body)
        try:
            answer = self.client.upload_part(
                Bucket=self.bucket,
                Key=self.key,
                UploadId=self.upload_id,
                PartNumber=number,
                Body=body,
            )
        except Exception as exc:
            raise self._fail(exc, f"upload part {number} of s3://{self.bucket}/{self.key}") from exc
        self.etags.append(answer["ETag"])

    def finish(self) -> dict[str, Any]:
        """Upload the tail as the last part; the object's description for the commit handle
        (bucket-relative key, upload id, part ETags, size, rows, SHA-256 of its bytes)."""
        if self._buffer or not self.etags:
            self._upload_buffer()
        return {
            "key": self.key,
            "upload_id": self.upload_id,
            "etags": list(self.etags),
            "etag": multipart_etag(self.etags),
            "size": self.size,
            "rows": self.rows,
            "sha256": self._digest.hexdigest(),
        }
