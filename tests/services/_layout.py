"""Where the test bed lives: folders, ports and versions, all overridable from the environment.

Every server listens on 127.0.0.1 only, on ports below Linux's ephemeral range (32768+) so an
outgoing connection can never have taken one. Each value can be overridden by an environment
variable (named beside it) so that a second test bed, or a machine where a port is taken, can
run side by side.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"{name}={raw!r} is not a port number; unset it or give an integer"
        ) from None


def _env_path(name: str, default: Path) -> Path:
    raw = os.environ.get(name)
    return Path(raw).expanduser().resolve() if raw else default


@dataclass(frozen=True)
class PostgresPorts:
    port: int = 15432  # DS_PG_PORT


@dataclass(frozen=True)
class KafkaPorts:
    broker: int = 19092  # DS_KAFKA_PORT
    controller: int = 19093  # DS_KAFKA_CONTROLLER_PORT


@dataclass(frozen=True)
class S3Ports:
    """SeaweedFS `weed mini` opens five servers, each with an HTTP and a gRPC port.

    The gRPC ports are HTTP + 10000: mini's embedded worker dials the admin server at that
    offset whatever `-admin.port.grpc` says, so every base port must stay below 55536.
    """

    s3: int = 18333  # DS_S3_PORT
    master: int = 19333  # DS_S3_MASTER_PORT
    volume: int = 18080  # DS_S3_VOLUME_PORT
    filer: int = 18888  # DS_S3_FILER_PORT
    admin: int = 13646  # DS_S3_ADMIN_PORT

    def all(self) -> dict[str, int]:
        """Every port the server listens on, by role."""
        ports: dict[str, int] = {}
        for role in ("s3", "master", "volume", "filer", "admin"):
            http = getattr(self, role)
            ports[role] = http
            ports[f"{role}.grpc"] = http + 10000
        return ports


@dataclass(frozen=True)
class Layout:
    """Folders and ports of one test bed.

    `root` holds each server's data and logs (`.services/` in the checkout, git-ignored);
    `cache` holds what is slow to fetch and safe to share between checkouts (Maven-built
    classpaths), by default under the user's cache folder so a fresh clone reuses it.
    """

    root: Path
    cache: Path
    postgres: PostgresPorts = field(default_factory=PostgresPorts)
    kafka: KafkaPorts = field(default_factory=KafkaPorts)
    s3: S3Ports = field(default_factory=S3Ports)

    @classmethod
    def from_env(cls) -> Layout:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return cls(
            root=_env_path("DS_SERVICES_DIR", REPO_ROOT / ".services"),
            cache=_env_path("DS_CACHE_DIR", Path(xdg) / "durable-sinks"),
            postgres=PostgresPorts(port=_env_int("DS_PG_PORT", PostgresPorts.port)),
            kafka=KafkaPorts(
                broker=_env_int("DS_KAFKA_PORT", KafkaPorts.broker),
                controller=_env_int("DS_KAFKA_CONTROLLER_PORT", KafkaPorts.controller),
            ),
            s3=S3Ports(
                s3=_env_int("DS_S3_PORT", S3Ports.s3),
                master=_env_int("DS_S3_MASTER_PORT", S3Ports.master),
                volume=_env_int("DS_S3_VOLUME_PORT", S3Ports.volume),
                filer=_env_int("DS_S3_FILER_PORT", S3Ports.filer),
                admin=_env_int("DS_S3_ADMIN_PORT", S3Ports.admin),
            ),
        )

    def service_dir(self, name: str) -> Path:
        return self.root / name

    def log_dir(self) -> Path:
        return self.root / "logs"
