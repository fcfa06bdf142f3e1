"""Toxiproxy: a TCP proxy in front of the faults bed's servers whose connections tests break
on purpose (reset, black hole, latency, ...; client in tests/support/toxiproxy.py).

Built from source with `go install github.com/Shopify/toxiproxy/v2/cmd/server@<VERSION>` into
the cache folder (once per version, shared by checkouts), run on 127.0.0.1 with its API on
`layout.toxiproxy.api`. `up` (re)creates the proxies idempotently, enabled and without toxics.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.support.toxiproxy import ProxyConfig, ToxiproxyError
from tests.support.toxiproxy import Toxiproxy as ToxiproxyApi

from ._layout import Layout
from ._process import ServiceError, require_free_ports, run, start_daemon, wait_until
from ._service import Daemon
from ._steps import ensure_folder

NAME = "toxiproxy"
VERSION = "v2.12.0"
MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
START_TIMEOUT = 30.0
#: Proxy names, as tests and the fixtures know them.
POSTGRES_PROXY = "faults-postgres"
KAFKA_PROXY = "faults-kafka"
#: In front of the main bed's S3 server: only connections made through it are broken.
S3_PROXY = "s3"


def _go() -> str:
    found = shutil.which("go") or next(
        (p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if Path(p).exists()), None
    )
    if found is None:
        raise ServiceError(
            NAME,
            f"Go is not installed: Toxiproxy {VERSION} is built with `go install {MODULE}@"
            f"{VERSION}`, which needs Go 1.22 or newer on PATH (https://go.dev/dl/).",
        )
    return found


class Toxiproxy(Daemon):
    name = NAME
    stop_timeout = 10.0

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.home = layout.service_dir(NAME)
        self.log = self.home / "toxiproxy.log"
        self.pid_file = self.home / "toxiproxy.pid"
        self.api = ToxiproxyApi(f"http://127.0.0.1:{layout.toxiproxy.api}", timeout=5)

    def proxies(self) -> list[ProxyConfig]:
        """The proxies `up` makes: each listens on 127.0.0.1 and forwards to a faults server."""
        faults, ports = self.layout.faults, self.layout.toxiproxy
        return [
            ProxyConfig(
                POSTGRES_PROXY, f"127.0.0.1:{ports.postgres}", f"127.0.0.1:{faults.postgres}"
            ),
            ProxyConfig(
                KAFKA_PROXY, f"127.0.0.1:{ports.kafka}", f"127.0.0.1:{faults.kafka_external}"
            ),
            ProxyConfig(S3_PROXY, f"127.0.0.1:{ports.s3}", f"127.0.0.1:{self.layout.s3.s3}"),
        ]

    def ports(self) -> dict[str, int]:
        ports = {"api": self.layout.toxiproxy.api}
        for proxy in self.proxies():
            ports[proxy.name] = int(proxy.listen.rpartition(":")[2])
        return ports

    def binary(self) -> Path:
        """The server binary, built once per VERSION into the cache folder (a set-up step,
        tests/services/_steps.py: one build at a time, published only once `go install`
        succeeded)."""
        folder = self.layout.cache / "toxiproxy" / VERSION

        def build(staging: Path) -> None:
            run(
                NAME,
                [_go(), "install", f"{MODULE}@{VERSION}"],
                timeout=600,
                env={**os.environ, "GOBIN": str(staging), "CGO_ENABLED": "0"},
                cwd=staging,
                fix="`go install` must reach the Go module proxy; the output below names "
                "what failed.",
            )
            (staging / "server").rename(staging / "toxiproxy-server")

        ensure_folder(NAME, f"Toxiproxy {VERSION} build", folder, build)
        return folder / "toxiproxy-server"

    def up(self) -> None:
        if self.pid() is None:
            require_free_ports(NAME, self.ports())
            binary = self.binary()
            self.home.mkdir(parents=True, exist_ok=True)
            start_daemon(
                [str(binary), "-host", "127.0.0.1", "-port", str(self.layout.toxiproxy.api)],
                log=self.log,
                pid_file=self.pid_file,
                cwd=self.home,
                # Debug (the default) logs every API request; info keeps connections and toxics.
                env={**os.environ, "LOG_LEVEL": "info"},
            )
        wait_until(
            NAME,
            self.ready,
            timeout=START_TIMEOUT,
            what="the API to answer",
            log=self.log,
            alive=lambda: self.pid() is not None,
        )
        try:
            for proxy in self.proxies():
                self.api.ensure_proxy(proxy)
        except ToxiproxyError as exc:
            raise ServiceError(NAME, f"could not create the proxies: {exc}", log=self.log) from None

    def ready(self) -> bool:
        return self.api.answers()

    def describe(self) -> str:
        proxies = ", ".join(
            f"{p.name} {p.listen.rpartition(':')[2]}->{p.upstream.rpartition(':')[2]}"
            for p in self.proxies()
        )
        return f"api {self.api.url}; {proxies}"

    def log_files(self) -> tuple[Path, ...]:
        return (self.log,)
