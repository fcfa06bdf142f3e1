"""The S3 sink's conformance target: a fresh prefix in a test-bed S3 server, read as the
sink's readers would (the epoch markers, then the objects they list)."""

from __future__ import annotations

import io
import uuid
from typing import Any

import pyarrow.parquet as pq

from durable_sinks.core import SinkConnector
from durable_sinks.sinks.s3 import S3, EpochMarker, S3Sink
from durable_sinks.testing import COLUMNS, Row
from tests.services import S3Endpoint
from tests.support.s3_objects import delete_prefix, incomplete_uploads, object_keys


def s3_options(endpoint: S3Endpoint, path: str, **options: Any) -> dict[str, Any]:
    """An S3 sink's options for a test-bed server (what `sink("s3", ...)` takes)."""
    return {
        "path": path,
        "endpoint_url": endpoint.endpoint_url,
        "region": endpoint.region,
        "access_key_id": endpoint.access_key_id,
        "secret_access_key": endpoint.secret_access_key,
        "addressing_style": "path",
        **({"ca_bundle": endpoint.ca_bundle} if endpoint.ca_bundle else {}),
        **options,
    }


def s3_sink_config(endpoint: S3Endpoint, path: str, **options: Any) -> S3:
    """An S3 sink's settings for a test-bed server."""
    return S3(**s3_options(endpoint, path, **options))


class S3Target:
    """A fresh prefix; readers see the objects listed by epoch markers only."""

    def __init__(self, endpoint: S3Endpoint, name: str = "s3", **options: Any) -> None:
        self.endpoint = endpoint
        self.name = name
        self.options = options
        self.bucket = endpoint.bucket
        self.prefix = f"s3conf-{uuid.uuid4().hex[:12]}"
        self._epochs = f"{self.prefix}/_epochs/"
        self.client = endpoint.client()
        # By marker key: a published marker never changes (create-only), so each is read
        # once (the suite reads the target after every step).
        self._markers: dict[str, EpochMarker] = {}
        self._rows: dict[str, list[Row]] = {}

    def config(self) -> S3:
        return s3_sink_config(
            self.endpoint, f"s3://{self.bucket}/{self.prefix}", name=self.name, **self.options
        )

    def connector(self) -> SinkConnector:
        return S3Sink(self.config())

    def markers(self) -> dict[str, EpochMarker]:
        return self._markers_among(object_keys(self.client, self.bucket, self._epochs))

    def _markers_among(self, keys: list[str]) -> dict[str, EpochMarker]:
        """The markers among `keys` (a listing of the prefix), each read once."""
        for key in keys:
            if key.startswith(self._epochs) and key not in self._markers:
                body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                self._markers[key] = EpochMarker.from_bytes(body, source=key)
        return {key: self._markers[key] for key in keys if key.startswith(self._epochs)}

    def committed_rows(self) -> list[Row]:
        rows: list[Row] = []
        for key, marker in sorted(self.markers().items()):
            if key not in self._rows:
                self._rows[key] = [row for o in marker.objects for row in self._read(o.key)]
            rows += self._rows[key]
        return rows

    def _read(self, key: str) -> list[Row]:
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        table = pq.read_table(io.BytesIO(body)).select(list(COLUMNS))
        return [tuple(r[c] for c in COLUMNS) for r in table.to_pylist()]

    def leftovers(self) -> list[str]:
        """Uploads in progress, and data objects no marker lists (one listing of the prefix
        serves both the markers and the data objects)."""
        keys = object_keys(self.client, self.bucket, f"{self.prefix}/")
        listed = {o.key for m in self._markers_among(keys).values() for o in m.objects}
        strays = [
            f"{key} (outside every committed epoch)"
            for key in keys
            if key.startswith(f"{self.prefix}/epoch=") and key not in listed
        ]
        uploads = incomplete_uploads(self.client, self.bucket, f"{self.prefix}/")
        return [f"{u.key} ({u.upload_id})" for u in uploads] + strays

    def cleanup(self) -> None:
        delete_prefix(self.client, self.bucket, f"{self.prefix}/")
