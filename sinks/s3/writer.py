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

from durable_sinks.clients.s3 import is_missing, multipart_etag
from durable_sinks.core.errors import DurableSinkError, FencedError
from durable_sinks.core.evolution import schema_text
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.sink_base import OpenParticipant, SinkBase
from durable_sinks.core.threads import process_pool

from .config import S3
from .handles import S3Object
from .layout import DataKey, Layout

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
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


class S3Participant(OpenParticipant):
    """The participant being written: its finished objects and the one being uploaded.

    Rows are gathered into row groups (`row_group_rows` / `row_group_bytes`), encoded as
    Parquet into the object being uploaded, and an object is finished at `max_file_bytes`
    or when the batches' schema changes (one schema per object)."""

    def __init__(
        self,
        epoch: int,
        name: ParticipantName,
        sink: SinkBase[S3],
        client: S3Client,
        layout: Layout,
        count: Callable[[str, float], None],
    ) -> None:
        super().__init__(epoch, name)
        self._sink, self._client, self._layout, self._count = sink, client, layout, count
        self.rows = 0
        self.finished: list[S3Object] = []
        self.upload: ObjectUpload | None = None
        self.writer: pq.ParquetWriter | None = None
        #: The schema of the object being written (and of the rows gathered for it).
        self.schema: pa.Schema | None = None
        #: Batches gathered for the next row group, not yet encoded, and their size.
        self.gathered: list[pa.RecordBatch] = []
        self.gathered_rows = 0
        self.gathered_bytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """Gather `batch` (not empty) for the next row group, written once it is full."""
        if self.schema is not None and not self.schema.equals(batch.schema):
            self.finish_object()  # one schema per object: the next one is evolved
        self.schema = batch.schema
        self.gathered.append(batch)
        self.gathered_rows += batch.num_rows
        self.gathered_bytes += batch.nbytes
        self.rows += batch.num_rows
        config = self._sink.config
        if self.gathered_rows >= config.row_group_rows or self.gathered_bytes >= min(
            config.row_group_bytes, config.max_file_bytes
        ):
            self._write_row_group()

    def _write_row_group(self) -> None:
        """Encode the gathered batches as one row group (as pyarrow's own `write_table` of
        them would) into the object being uploaded; a full object is finished."""
        import pyarrow as pa

        if not self.gathered:
            return
        assert self.schema is not None
        if self.writer is None:
            self._start_object(self.schema)
        assert self.writer is not None
        assert self.upload is not None
        table = pa.Table.from_batches(self.gathered, self.schema)
        rows = self.gathered_rows
        self.gathered, self.gathered_rows, self.gathered_bytes = [], 0, 0
        before = self.upload.size
        self.writer.write_table(table, row_group_size=max(rows, 1))
        self.upload.rows += rows
        self._count("bytes", self.upload.size - before)
        if self.upload.size >= self._sink.config.max_file_bytes:
            self.finish_object()

    def _start_object(self, schema: pa.Schema) -> None:
        import pyarrow.parquet as pq

        config = self._sink.config
        key = self._layout.data_key(DataKey.of(self.name, len(self.finished)))
        self.upload = ObjectUpload(
            self._client,
            self._layout.bucket,
            key,
            str(self.name),
            config.part_size_bytes,
            self._upload_failure,
        )
        self.writer = pq.ParquetWriter(self.upload, schema, compression=config.compression)

    def _upload_failure(self, exc: BaseException, action: str) -> DurableSinkError:
        """An upload that vanished under a writer was aborted by someone else: a newer
        coordinator's recovery, the driver discarding a losing executor attempt, or a bucket
        lifecycle rule. This attempt can no longer commit."""
        if is_missing(exc):
            return FencedError(
                f"cannot {action}: the upload was aborted by someone else (a newer "
                "coordinator's recovery, the driver discarding this attempt, or a bucket "
                "lifecycle rule)",
                **self._sink.where(self.epoch),
                fix="if another driver of this job started, stop this one; otherwise restart "
                "the query: the epoch is written again",
            )
        return self._sink.failure(exc, action, self.epoch)

    def finish_object(self) -> None:
        """Write what is gathered and complete the object's Parquet file and upload (its
        multipart upload stays open: phase 2 completes it)."""
        self._write_row_group()
        if self.writer is None or self.upload is None:
            return
        self.writer.close()
        self.writer = None
        schema = self.schema
        upload, self.upload = self.upload, None
        finished = upload.finish()
        self.finished.append(
            S3Object(
                key=str(finished["key"]),
                upload_id=str(finished["upload_id"]),
                etags=tuple(str(e) for e in finished["etags"]),
                etag=str(finished["etag"]),
                size=int(finished["size"]),
                rows=int(finished["rows"]),
                sha256=str(finished["sha256"]),
                schema=None if schema is None else schema_text(schema),
            )
        )
        self._count("parts_uploaded", len(upload.etags))

    def uploads(self) -> list[tuple[str, str]]:
        """(key, upload id) of every upload this participant started (waiting for requests
        in flight; an upload whose creation failed has nothing to abort)."""
        started = [(o.key, o.upload_id) for o in self.finished]
        if self.upload is not None:
            upload_id = self.upload.started()
            if upload_id is not None:
                started.append((self.upload.key, upload_id))
        return started
