"""How tests reach the servers: addresses and credentials, with secrets kept out of reprs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .tls import SERVER_NAME, TestbedTls

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@dataclass(frozen=True)
class PostgresEndpoint:
    """One server (`host`, `port`), or several: `more_hosts` are tried after it, in order, and
    the connection string asks for the one that accepts writes (`target_session_attrs=
    read-write`), as a client of a primary with standbys is given."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    dbname: str = "postgres"
    #: The test bed's TLS files (the server also speaks TLS: `tls_conninfo`).
    tls: TestbedTls | None = None
    #: Whether `conninfo()` itself connects over TLS (`over_tls()`), for code that takes an
    #: endpoint and calls `conninfo()` (conformance targets, helpers).
    verified_tls: bool = False
    #: Further servers (host, port) of a replicated cluster, tried after `host`:`port`.
    more_hosts: tuple[tuple[str, int], ...] = ()

    @property
    def servers(self) -> tuple[tuple[str, int], ...]:
        """Every server the endpoint names, in the order clients try them."""
        return ((self.host, self.port), *self.more_hosts)

    def over_tls(self) -> PostgresEndpoint:
        """This endpoint, every `conninfo()` of which is `tls_conninfo()`."""
        return replace(self, verified_tls=True)

    def conninfo(self, **extra: str) -> str:
        """A libpq connection string without TLS (holds the password: never log it)."""
        params = {
            "host": ",".join(host for host, _ in self.servers),
            "port": ",".join(str(port) for _, port in self.servers),
            **({"target_session_attrs": "read-write"} if self.more_hosts else {}),
            "user": self.user,
            "password": self.password,
            "dbname": self.dbname,
            "connect_timeout": "10",
            "sslmode": "disable",
            **(self._tls_settings() if self.verified_tls else {}),
            **extra,
        }
        return " ".join(f"{key}={_quote(value)}" for key, value in params.items())

    def tls_conninfo(self, **extra: str) -> str:
        """A connection string over TLS that verifies the server's certificate and host name
        (`sslmode=verify-full` against the test bed's CA, host `localhost`)."""
        return self.conninfo(**{**self._tls_settings(), **extra})

    def _tls_settings(self) -> dict[str, str]:
        if self.tls is None:
            raise ValueError(f"{self!r} has no TLS files")
        host = ",".join(SERVER_NAME for _ in self.servers)
        return {"host": host, "sslmode": "verify-full", "sslrootcert": str(self.tls.ca)}

    def jdbc_url(self) -> str:
        hosts = ",".join(f"{host}:{port}" for host, port in self.servers)
        primary = "&targetServerType=primary" if self.more_hosts else ""
        return f"jdbc:postgresql://{hosts}/{self.dbname}?sslmode=disable{primary}"


def _quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


ConfigValue = str | int | float | bool


@dataclass(frozen=True)
class KafkaEndpoint:
    bootstrap_servers: str
    #: How to reach a secured listener (security.protocol, SASL, ssl.ca.location): may hold a
    #: password, so never shown.
    security: Mapping[str, ConfigValue] = field(default_factory=dict, repr=False)

    def config(self, settings: Mapping[str, ConfigValue] | None = None) -> dict[str, ConfigValue]:
        """A confluent-kafka client configuration for this broker, plus `settings`."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.security, **(settings or {})}


@dataclass(frozen=True)
class S3Endpoint:
    endpoint_url: str
    region: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    bucket: str = "durable-sinks-test"
    #: The CA bundle that verifies an `https://` endpoint (None: the system's).
    ca_bundle: str | None = None

    def client(self) -> S3Client:
        """A boto3 S3 client that signs every request with the test bed's credentials."""
        import boto3
        from botocore.config import Config

        client: S3Client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            verify=self.ca_bundle,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=5,
                read_timeout=30,
            ),
        )
        return client


@dataclass(frozen=True)
class IcebergRestEndpoint:
    """SeaweedFS's Iceberg REST catalog, its tables kept in an S3 Tables bucket (`warehouse`)
    whose data files pyiceberg's FileIO reads and writes through `s3`.

    The catalog authenticates with OAuth client credentials (`credential` is
    `ACCESS_KEY:SECRET_KEY` of the S3 gateway's user): never shown."""

    uri: str
    warehouse: str
    s3: S3Endpoint
    credential: str = field(repr=False)

    def catalog_properties(self, **overrides: str) -> dict[str, str]:
        """pyiceberg's properties for this catalog and its FileIO, plus `overrides` (hold
        secrets: never log them)."""
        return {
            "type": "rest",
            "uri": self.uri,
            "warehouse": self.warehouse,
            "credential": self.credential,
            "oauth2-server-uri": f"{self.uri}/v1/oauth/tokens",
            "s3.endpoint": self.s3.endpoint_url,
            "s3.region": self.s3.region,
            "s3.access-key-id": self.s3.access_key_id,
            "s3.secret-access-key": self.s3.secret_access_key,
            **overrides,
        }
