"""How tests reach the servers: addresses and credentials, with secrets kept out of reprs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@dataclass(frozen=True)
class PostgresEndpoint:
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    dbname: str = "postgres"

    def conninfo(self, **extra: str) -> str:
        """A libpq connection string (holds the password: never log it)."""
        params = {
            "host": self.host,
            "port": str(self.port),
            "user": self.user,
            "password": self.password,
            "dbname": self.dbname,
            "connect_timeout": "10",
            **extra,
        }
        return " ".join(f"{key}={_quote(value)}" for key, value in params.items())

    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.dbname}"


def _quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


ConfigValue = str | int | float | bool


@dataclass(frozen=True)
class KafkaEndpoint:
    bootstrap_servers: str

    def config(self, settings: Mapping[str, ConfigValue] | None = None) -> dict[str, ConfigValue]:
        """A confluent-kafka client configuration for this broker, plus `settings`."""
        return {"bootstrap.servers": self.bootstrap_servers, **(settings or {})}


@dataclass(frozen=True)
class S3Endpoint:
    endpoint_url: str
    region: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    bucket: str = "durable-sinks-test"

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
            config=Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=5,
                read_timeout=30,
            ),
        )
        return client
