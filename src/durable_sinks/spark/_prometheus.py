"""The Prometheus endpoint of `durable_sink(..., metrics_port=...)`: needs the `metrics` extra
(`pip install 'durable-sinks[metrics]'`), imported only when a writer is given a port.

One HTTP server and one registry per process and port, shared by every writer given that
port (several queries of one driver, a restarted query's new writer): each writer adds what
its own counters grew by, labelled with its job. Port 0 serves on a free port chosen when the
first writer asks for it, shared likewise by every later writer given 0. The server listens
on every interface (as Prometheus exporters do, to be scraped from another host) in a daemon
thread, and lives as long as the process: a writer closing does not stop it.

The registry is our own (not prometheus-client's global one): only `durable_sinks_*` metrics
are served. They hold job ids, sink names and numbers, never an option's value.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from durable_sinks.coordinator import InFlight
from durable_sinks.coordinator._metrics import PHASES
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.joblog import JobLogger

from ._observe import TOTAL, Observation, increments

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

PREFIX = "durable_sinks_"
INSTALL = "pip install 'durable-sinks[metrics]'"
#: Seconds: from a sub-millisecond lookup to a batch that rode out a two-minute outage.
PHASE_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip

#: The counters labelled by job (name without the prefix and `_total`: the help text).
COUNTERS = {
    "epochs_committed": "Epochs (Spark batches) committed in every sink by this process",
    "epochs_already_committed": "Replayed epochs found already decided: finished, the data "
    "given again ignored",
    "epochs_failed": "Batches whose foreachBatch call raised (the query saw the error)",
    "epochs_retried": "Failed attempts at a batch that were attempted again (outages ridden out)",
    "recovered_commits": "Leftover participants committed by recovery at a start",
    "recovered_rollbacks": "Leftover participants rolled back by recovery at a start",
    "replay_mismatches": "Replayed epochs whose data differed from what was committed",
}


def require_client() -> None:
    """ConfigError naming the extra unless prometheus-client can be imported."""
    try:
        import prometheus_client  # noqa: F401 - only to say what is missing
    except ImportError as exc:
        raise ConfigError(
            "metrics_port needs prometheus-client, which is not installed where the driver runs",
            fix=f"{INSTALL} (prometheus-client>=0.20), or drop metrics_port",
        ) from exc


class Families:
    """The metric families of one registry, and how an Observation updates them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.registry = registry
        self.counters = {
            name: Counter(PREFIX + name, text, ["job"], registry=registry)
            for name, text in COUNTERS.items()
        }
        self.rows = Counter(
            PREFIX + "rows",
            "Rows written into each sink in committed epochs",
            ["job", "sink"],
            registry=registry,
        )
        self.bytes = Counter(
            PREFIX + "bytes",
            "Bytes written into each sink in committed epochs, as the sink counts them",
            ["job", "sink"],
            registry=registry,
        )
        self.dead_letters = Counter(
            PREFIX + "dead_letters",
            "Rows a sink refused that committed into the job's dead-letter sink, by reason",
            ["job", "sink", "reason"],
            registry=registry,
        )
        self.seconds = Histogram(
            PREFIX + "epoch_phase_seconds",
            f"Seconds per epoch in each phase ({', '.join(PHASES)}) and in all ({TOTAL}: the "
            "foreachBatch call, reading and retries included)",
            ["job", "phase"],
            buckets=PHASE_BUCKETS,
            registry=registry,
        )
        self.last_committed = Gauge(
            PREFIX + "last_committed_epoch",
            "The newest epoch (Spark batch id) found committed in every sink",
            ["job"],
            registry=registry,
        )
        self.in_doubt = Gauge(
            PREFIX + "prepared_in_doubt",
            "Participants the last start found left prepared or open by an earlier driver or "
            "attempt (committed, rolled back or adopted by its recovery)",
            ["job"],
            registry=registry,
        )
        self._lock = threading.Lock()
        self._newest: dict[str, int] = {}
        #: Per job, what reads its epoch in flight (the newest writer's of the job).
        self._watching: dict[str, Callable[[], InFlight | None]] = {}
        registry.register(_InFlightCollector(self))

    def watching(self, job: str, read: Callable[[], InFlight | None]) -> None:
        """Serve `job`'s epoch in flight, read by `read` at each scrape."""
        with self._lock:
            self._watching[job] = read

    def in_flight(self) -> dict[str, InFlight | None]:
        with self._lock:
            readers = dict(self._watching)
        return {job: read() for job, read in readers.items()}

    def add_job(self, job: str) -> None:
        """Every series of `job` at 0, so that rate() counts from its first increment."""
        with self._lock:
            for counter in self.counters.values():
                counter.labels(job=job)
            self.in_doubt.labels(job=job)

    def record(self, seen: Observation, grown: Mapping[str, int]) -> None:
        """Counters grown by `grown` (what the writer's own counters grew by since its last
        update); this batch's rows, bytes and seconds; the gauges set."""
        job = seen.job
        with self._lock:
            for name, n in grown.items():
                self.counters[name].labels(job=job).inc(n)
            for sink, n in seen.rows.items():
                self.rows.labels(job=job, sink=sink).inc(n)
            for sink, n in seen.bytes.items():
                self.bytes.labels(job=job, sink=sink).inc(n)
            for sink, reasons in seen.dead_letters.items():
                for reason, n in reasons.items():
                    self.dead_letters.labels(job=job, sink=sink, reason=reason).inc(n)
            for phase, seconds in seen.seconds.items():
                self.seconds.labels(job=job, phase=phase).observe(seconds)
            if seen.committed and seen.epoch >= self._newest.get(job, -1):
                self._newest[job] = seen.epoch
                self.last_committed.labels(job=job).set(seen.epoch)
            self.in_doubt.labels(job=job).set(seen.in_doubt)


class _InFlightCollector:
    """The gauges of each job's epoch in flight, read when Prometheus scrapes (a batch that
    hangs shows while it hangs, not when it ends)."""

    def __init__(self, families: Families) -> None:
        self._families = families

    def describe(self) -> list[Metric]:
        return []  # (registering must not read the writers)

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        epoch = GaugeMetricFamily(
            PREFIX + "epoch_in_flight",
            "The epoch (Spark batch id) being written now; -1 between batches",
            labels=["job"],
        )
        age = GaugeMetricFamily(
            PREFIX + "epoch_in_flight_seconds",
            "Seconds since the epoch being written began; 0 between batches",
            labels=["job"],
        )
        phase = GaugeMetricFamily(
            PREFIX + "phase_in_flight_seconds",
            f"Seconds the epoch being written has been in its phase ({', '.join(PHASES)}), "
            "0 for the other phases and between batches",
            labels=["job", "phase"],
        )
        calls = GaugeMetricFamily(
            PREFIX + "sink_call_in_flight_seconds",
            "Seconds the oldest running call of each sink (write_batch, pre_commit, "
            "commit_epoch, ...) has been running; a series only while one runs",
            labels=["job", "sink", "call"],
        )
        for job, seen in sorted(self._families.in_flight().items()):
            epoch.add_metric([job], -1 if seen is None else seen.epoch)
            age.add_metric([job], 0.0 if seen is None else seen.epoch_age_s)
            for name in PHASES:
                current = seen is not None and seen.phase == name
                phase.add_metric([job, name], seen.phase_age_s if current and seen else 0.0)
            oldest: dict[tuple[str, str], float] = {}
            for call in seen.calls if seen is not None else ():
                key = (call.sink, call.call)
                oldest[key] = max(oldest.get(key, 0.0), call.age_s)
            for (sink, name), seconds in sorted(oldest.items()):
                calls.add_metric([job, sink, name], seconds)
        yield from (epoch, age, phase, calls)


@dataclass
class Endpoint:
    """One serving registry: the port it listens on (the chosen one for port 0)."""

    port: int
    families: Families


_endpoints: dict[int, Endpoint] = {}
_endpoints_lock = threading.Lock()


def endpoint(port: int, *, job: str) -> Endpoint:
    """The process's endpoint for `port` (0: a free port, chosen once), started on first
    use. ConfigError when prometheus-client is missing or the port cannot be bound."""
    require_client()
    from prometheus_client import CollectorRegistry, start_wsgi_server

    with _endpoints_lock:
        found = _endpoints.get(port)
        if found is not None:
            return found
        registry = CollectorRegistry(auto_describe=True)
        families = Families(registry)
        try:
            server, _thread = start_wsgi_server(port, registry=registry)
        except OSError as exc:
            raise ConfigError(
                f"metrics_port {port}: cannot serve metrics there ({exc.strerror or exc})",
                job=job,
                fix="give a free port (another process holds this one), or metrics_port=0 for "
                "any free port (logged at start)",
            ) from exc
        found = Endpoint(int(server.server_port), families)
        _endpoints[port] = found
        if port == 0:
            _endpoints[found.port] = found  # a writer given the chosen port shares it too
        JobLogger(job, component="spark").info(
            "serving Prometheus metrics on port %d (/metrics)", found.port
        )
        return found


class JobMetrics:
    """One writer's metrics on a shared endpoint: it remembers the counters it has added, so
    that several writers of one process (or one job) add up instead of overwriting."""

    def __init__(self, port: int, job: str) -> None:
        self.endpoint = endpoint(port, job=job)
        self.job = job
        self._added: dict[str, int] = {}
        self.endpoint.families.add_job(job)

    @property
    def port(self) -> int:
        return self.endpoint.port

    def watching(self, read: Callable[[], InFlight | None]) -> None:
        """Serve this job's epoch in flight, read by `read` at each scrape."""
        self.endpoint.families.watching(self.job, read)

    def started(self, in_doubt: int) -> None:
        """The writer's coordinator started: its recovery found `in_doubt` leftovers."""
        self.endpoint.families.in_doubt.labels(job=self.job).set(in_doubt)

    def update(self, seen: Observation) -> None:
        """The metrics after one batch (`seen.counters` are the writer's cumulative ones)."""
        grown = increments(self._added, seen.counters)
        self._added = dict(seen.counters)
        self.endpoint.families.record(seen, grown)
