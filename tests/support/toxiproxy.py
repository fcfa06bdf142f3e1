"""A small typed client of Toxiproxy's HTTP API (standard library only).

Toxiproxy (tests/services/toxiproxy.py starts it) is a TCP proxy whose connections we break
on purpose: a *proxy* listens on one port and forwards to an upstream server; *toxics* added
to it act on the live connections and the new ones until removed:

    reset_peer  close every connection with a TCP RST (after `timeout` ms; 0 = at once)
    timeout     black hole: data is dropped; after `timeout` ms the connection is closed
                (0 = never: the peer sees nothing until its own time-out). Removing the
                toxic closes the connections it held (what was sent meanwhile is lost).
    latency     delay data by `latency` ms (+- `jitter`)
    slow_close  delay the close of a connection by `delay` ms
    bandwidth   limit the rate to `rate` KB/s

A disabled proxy refuses new connections and drops the existing ones.

    proxy = Toxiproxy("http://127.0.0.1:18474").proxy("faults-postgres")
    with proxy.fault("timeout", timeout=0):
        ...  # everything through the proxy hangs here
    # the toxic is gone again

`Toxiproxy.reset()` enables every proxy and removes every toxic: each test starts clean.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, cast

__all__ = [
    "Direction",
    "Proxy",
    "ProxyConfig",
    "Toxic",
    "ToxicKind",
    "Toxiproxy",
    "ToxiproxyError",
]

ToxicKind = Literal["reset_peer", "timeout", "latency", "slow_close", "bandwidth"]
#: `downstream`: from the server to the client; `upstream`: from the client to the server.
Direction = Literal["downstream", "upstream"]


class ToxiproxyError(RuntimeError):
    """The Toxiproxy API refused a request or could not be reached; the message says which
    request and what it answered."""


@dataclass(frozen=True)
class ProxyConfig:
    """Where a proxy listens and where it forwards to (each `host:port`)."""

    name: str
    listen: str
    upstream: str
    enabled: bool = True


@dataclass(frozen=True)
class Toxic:
    name: str
    kind: ToxicKind
    stream: Direction
    toxicity: float
    attributes: dict[str, int] = field(default_factory=dict)


class Toxiproxy:
    """The API of one Toxiproxy server, e.g. `Toxiproxy("http://127.0.0.1:18474")`."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"Toxiproxy({self.url!r})"

    # -- HTTP --------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: object = None) -> Any:
        """One API call; the decoded JSON answer (None when the answer is empty)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(  # noqa: S310 (an http:// URL of our own server)
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data is not None else {},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            raise ToxiproxyError(
                f"{method} {self.url}{path} answered {exc.code}: {detail}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ToxiproxyError(
                f"{method} {self.url}{path} failed: {exc}. Is Toxiproxy running? "
                "(`python -m tests.services up toxiproxy`)"
            ) from None
        return json.loads(raw) if raw.strip() else None

    # -- server ------------------------------------------------------------------------------
    def version(self) -> str:
        answer = self.request("GET", "/version")
        return str(answer["version"] if isinstance(answer, dict) else answer)

    def answers(self) -> bool:
        try:
            self.version()
        except ToxiproxyError:
            return False
        return True

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self.request("POST", "/reset")

    # -- proxies -----------------------------------------------------------------------------
    def proxies(self) -> dict[str, ProxyConfig]:
        answer = cast(dict[str, dict[str, Any]], self.request("GET", "/proxies"))
        return {name: _proxy_config(raw) for name, raw in answer.items()}

    def proxy(self, name: str) -> Proxy:
        return Proxy(self, name)

    def ensure_proxy(self, config: ProxyConfig) -> Proxy:
        """Create the proxy, or recreate it when one of that name differs; enable it and
        remove its toxics. Idempotent."""
        existing = self.proxies().get(config.name)
        if existing is not None and (existing.listen, existing.upstream) != (
            config.listen,
            config.upstream,
        ):
            self.request("DELETE", f"/proxies/{config.name}")
            existing = None
        if existing is None:
            self.request(
                "POST",
                "/proxies",
                {
                    "name": config.name,
                    "listen": config.listen,
                    "upstream": config.upstream,
                    "enabled": True,
                },
            )
        proxy = self.proxy(config.name)
        proxy.clear()
        proxy.enable()
        return proxy

    def delete_proxy(self, name: str) -> None:
        self.request("DELETE", f"/proxies/{name}")


class Proxy:
    """One proxy by name; every method is one or two API calls, nothing is cached."""

    def __init__(self, api: Toxiproxy, name: str) -> None:
        self.api = api
        self.name = name

    def __repr__(self) -> str:
        return f"Proxy({self.name!r} at {self.api.url})"

    def config(self) -> ProxyConfig:
        return _proxy_config(self.api.request("GET", f"/proxies/{self.name}"))

    def enable(self) -> None:
        self._set_enabled(True)

    def disable(self) -> None:
        """Refuse new connections and drop the open ones (like the server vanishing)."""
        self._set_enabled(False)

    def _set_enabled(self, enabled: bool) -> None:
        self.api.request("PATCH", f"/proxies/{self.name}", {"enabled": enabled})

    @contextmanager
    def disabled(self) -> Iterator[None]:
        """Disabled inside the block, enabled again on exit (also on error)."""
        self.disable()
        try:
            yield
        finally:
            self.enable()

    def toxics(self) -> list[Toxic]:
        answer = cast(list[dict[str, Any]], self.api.request("GET", f"/proxies/{self.name}/toxics"))
        return [_toxic(raw) for raw in answer]

    def add_toxic(
        self,
        kind: ToxicKind,
        *,
        stream: Direction = "downstream",
        toxicity: float = 1.0,
        name: str | None = None,
        **attributes: int,
    ) -> Toxic:
        """Add a toxic; it acts on the open connections and the new ones until removed.

        `attributes` are the kind's own (all integers): reset_peer `timeout` (ms), timeout
        `timeout` (ms, 0 = never close), latency `latency` and `jitter` (ms), slow_close
        `delay` (ms), bandwidth `rate` (KB/s). `toxicity` is the share of connections hit.
        """
        body = {
            "name": name or f"{kind}_{stream}_{uuid.uuid4().hex[:8]}",
            "type": kind,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": attributes,
        }
        return _toxic(self.api.request("POST", f"/proxies/{self.name}/toxics", body))

    def remove_toxic(self, name: str) -> None:
        self.api.request("DELETE", f"/proxies/{self.name}/toxics/{name}")

    def clear(self) -> None:
        """Remove every toxic of this proxy."""
        for toxic in self.toxics():
            self.remove_toxic(toxic.name)

    @contextmanager
    def fault(
        self,
        kind: ToxicKind,
        *,
        stream: Direction = "downstream",
        toxicity: float = 1.0,
        **attributes: int,
    ) -> Iterator[Toxic]:
        """A toxic for the duration of the block, removed on exit (also on error)."""
        toxic = self.add_toxic(kind, stream=stream, toxicity=toxicity, name=None, **attributes)
        try:
            yield toxic
        finally:
            self.remove_toxic(toxic.name)

    # Shorthands for the kinds fault tests use, each as a context manager.
    def reset_peer(self, timeout_ms: int = 0) -> AbstractContextManager[Toxic]:
        """Connections get a TCP RST `timeout_ms` after data flows (0: at once)."""
        return self.fault("reset_peer", timeout=timeout_ms)

    @contextmanager
    def black_hole(self, timeout_ms: int = 0) -> Iterator[list[Toxic]]:
        """Data is dropped in both directions (a `timeout` toxic on each stream); connections
        are closed after `timeout_ms` (0: never, the peer waits for its own time-out), and
        at the latest when the block is left (Toxiproxy closes what a timeout toxic held)."""
        streams: tuple[Direction, ...] = ("upstream", "downstream")
        with ExitStack() as stack:
            yield [
                stack.enter_context(self.fault("timeout", stream=stream, timeout=timeout_ms))
                for stream in streams
            ]

    def latency(self, latency_ms: int, jitter_ms: int = 0) -> AbstractContextManager[Toxic]:
        return self.fault("latency", latency=latency_ms, jitter=jitter_ms)

    def slow_close(self, delay_ms: int) -> AbstractContextManager[Toxic]:
        return self.fault("slow_close", delay=delay_ms)

    def bandwidth(self, rate_kb_per_s: int) -> AbstractContextManager[Toxic]:
        return self.fault("bandwidth", rate=rate_kb_per_s)


def _proxy_config(raw: dict[str, Any]) -> ProxyConfig:
    return ProxyConfig(
        name=str(raw["name"]),
        listen=str(raw["listen"]),
        upstream=str(raw["upstream"]),
        enabled=bool(raw.get("enabled", True)),
    )


def _toxic(raw: dict[str, Any]) -> Toxic:
    return Toxic(
        name=str(raw["name"]),
        kind=cast(ToxicKind, raw["type"]),
        stream=cast(Direction, raw["stream"]),
        toxicity=float(raw.get("toxicity", 1.0)),
        attributes={str(k): int(v) for k, v in (raw.get("attributes") or {}).items()},
    )
