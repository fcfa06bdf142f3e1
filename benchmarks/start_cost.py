"""Does a job's start grow with its history? A fresh coordinator's start with H committed
epochs behind it, H small and large, for every sink and every decision store.

    .venv/bin/python -m benchmarks.start_cost [--targets postgres,kafka,...] \
        [--histories 10,10000] [--repeats 5] [--chart PNG]

Needs the test bed's Postgres, Kafka and S3 (SeaweedFS, with its Iceberg REST catalog).
Targets (`--targets`, all by default): one per sink, each with the store it uses by default
(postgres: one-phase, the decisions are the sink's marker rows; kafka: the store the Kafka
sink hosts in its progress topic; s3 and delta: the store beside the sink; files and
iceberg: a local directory store; `iceberg-keep` is the Iceberg sink with `keep_snapshots`
at 100, whose table's metadata stays bounded), and one per decision store with the files sink, which
stresses a store least (`store-postgres`, `store-s3`; the directory store is the files
row's, the hosted store the kafka row's).

For each target and H, a job with H committed epochs (one row each, run through the
coordinator) is built once and kept under a fixed job id, folder, table, topic or prefix
(`start-cost-<target>-<H>`): a rerun reuses it and only adds what is missing. Then, each
repetition, a fresh coordinator (new sink instances, new store instance) is timed through
`start()` (validation, the new generation, each sink's `open`, recovery, the lost-epoch
check) plus the first epoch's checks that read history (the stream check, the lost-epoch
check of the first epoch, the decision lookup of epoch H); the median over `--repeats` is
printed, with the ratio of the largest H to the smallest and the number of S3 requests
each start made (at each H: a count the machine's load cannot blur); the histories' starts
alternate. Building is timed too (ms per epoch: the cost of an epoch as the history grows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

from durable_sinks.coordinator import Coordinator
from durable_sinks.coordinator._metrics import EpochMetrics
from durable_sinks.manifest._choose import default_store_for
from durable_sinks.spark import sink
from durable_sinks.spark._build import build_coordinator
from durable_sinks.spark._options import JobOptions
from durable_sinks.spark._specs import SinkSpec
from tests.services import up
from tests.support.s3_target import s3_options
from tests.support.targets import create_topic

TARGETS = (
    "postgres",
    "kafka",
    "s3",
    "files",
    "delta",
    "iceberg",
    "iceberg-keep",
    "store-postgres",
    "store-s3",
)
#: `iceberg-keep`'s `keep_snapshots`: the table's metadata bounded, not its history.
KEEP_SNAPSHOTS = 100
SOURCE = "start-cost-stream"
CACHE = Path(os.environ.get("DS_CACHE_DIR", Path.home() / ".cache" / "durable-sinks"))
SCHEMA = "start_cost"


@dataclass
class Job:
    """One target at one history length: how to build a fresh coordinator for it."""

    target: str
    history: int
    specs: list[SinkSpec]
    store: Callable[[], Any]  # a fresh decision store (or its target) per coordinator
    store_name: str

    @property
    def job_id(self) -> str:
        return f"start-cost-{self.target}-{self.history}"

    def coordinator(self) -> Coordinator:
        options = JobOptions(job_id=self.job_id, decision_store=self.store())
        return build_coordinator(self.specs, options, source=SOURCE)


def jobs(target: str, history: int, folder: Path) -> Job:
    """The job of `target` with `history` epochs; servers, schema, topic made if missing."""
    name = f"{target.replace('-', '_')}_{history}"
    local = folder / f"{target}-{history}"
    local.mkdir(parents=True, exist_ok=True)
    directory_store = str(local / "decisions")
    if target in ("postgres", "store-postgres"):
        dsn = up(["postgres"]).postgres.endpoint().conninfo()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{SCHEMA}"')
    if target in ("s3", "store-s3", "iceberg", "iceberg-keep"):
        s3 = up(["s3"]).s3.endpoint()
    if target == "postgres":
        spec = sink("postgres", dsn=dsn, table=f"{SCHEMA}.t_{name}", create_table=True)
        return Job(target, history, [spec], lambda: None, "postgres (one-phase: marker rows)")
    if target == "kafka":
        bootstrap = up(["kafka"]).kafka.endpoint().bootstrap_servers
        from confluent_kafka.admin import AdminClient

        topic = f"start-cost-{history}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        if topic not in admin.list_topics(timeout=10).topics:
            create_topic(admin, topic, partitions=1)
        spec = sink("kafka", bootstrap_servers=bootstrap, topic=topic)
        return Job(target, history, [spec], lambda: None, "hosted (Kafka progress topic)")
    if target == "s3":
        spec = sink("s3", **s3_options(s3, f"s3://{s3.bucket}/start-cost/{target}-{history}"))
        return Job(target, history, [spec], lambda: None, "s3 (beside the sink)")
    if target == "delta":
        spec = sink("delta", path=str(local / "table"), create_table=True)
        return Job(target, history, [spec], lambda: None, "directory (beside the table)")
    if target in ("iceberg", "iceberg-keep"):
        catalog = up(["s3"]).s3.catalog_endpoint()
        properties = catalog.catalog_properties()
        _namespace(properties, SCHEMA)
        keep = KEEP_SNAPSHOTS if target == "iceberg-keep" else None
        spec = sink(
            "iceberg",
            catalog=properties,
            catalog_name="rest",
            namespace=SCHEMA,
            table=f"t_{history}" if keep is None else f"t_keep_{history}",
            create_table=True,
            keep_snapshots=keep,
        )
        return Job(target, history, [spec], lambda: directory_store, "directory")
    files = sink("files", path=str(local / "files"))
    if target == "files":
        return Job(target, history, [files], lambda: directory_store, "directory")
    if target == "store-postgres":
        return Job(target, history, [files], lambda: dsn, "postgres")
    if target == "store-s3":
        options = s3_options(s3, f"s3://{s3.bucket}/start-cost/{target}-{history}")
        return Job(target, history, [files], lambda: default_store_for("s3", options), "s3")
    raise SystemExit(f"unknown target {target!r}: one of {', '.join(TARGETS)}")


def _namespace(properties: dict[str, str], namespace: str) -> None:
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("rest", **properties)
    if (namespace,) not in catalog.list_namespaces():
        catalog.create_namespace(namespace)


def rows(epoch: int) -> list[pa.RecordBatch]:
    batches: list[pa.RecordBatch] = pa.table(
        {"id": pa.array([epoch], pa.int64()), "v": ["x"]}
    ).to_batches()
    return batches


def build(job: Job) -> tuple[int, float | None]:
    """Run the job's missing epochs; (epochs added, ms per epoch of the last 100 added)."""
    coordinator = job.coordinator()
    try:
        coordinator.start()
        newest = coordinator.lost_epochs.newest
        first = 0 if newest is None else newest + 1
        recent: list[float] = []
        for epoch in range(first, job.history):
            started = time.perf_counter()
            coordinator.run_epoch(epoch, rows(epoch))
            recent = [*recent[-99:], (time.perf_counter() - started) * 1e3]
            if (epoch + 1) % 500 == 0:
                print(
                    f"  {job.job_id}: {epoch + 1} epochs, {statistics.median(recent):.1f} ms "
                    "per epoch",
                    flush=True,
                )
        return job.history - first, (statistics.median(recent) if recent else None)
    finally:
        coordinator.close()


class Requests:
    """S3 requests made by any boto3 client of this process (botocore's API calls)."""

    count = 0

    def install(self) -> None:
        from botocore.client import BaseClient

        call = BaseClient._make_api_call  # type: ignore[attr-defined]
        counter = self

        def counted(client: BaseClient, operation: str, params: Any) -> Any:
            counter.count += 1
            return call(client, operation, params)

        BaseClient._make_api_call = counted  # type: ignore[attr-defined]


requests = Requests()


def timed_start(job: Job) -> tuple[float, int]:
    """One fresh coordinator's start and first-epoch history checks (ms), and the number of
    epochs behind it (the job's `history`, or fewer when its building was stopped early)."""
    coordinator = job.coordinator()
    try:
        started = time.perf_counter()
        coordinator.start()
        newest = coordinator.lost_epochs.newest
        epoch = 0 if newest is None else newest + 1
        log = coordinator.log.bind(epoch=epoch)
        coordinator.streams.at_epoch(epoch, SOURCE, log)
        coordinator.lost_epochs.at_epoch(epoch)
        found = coordinator.decisions.lookup(epoch, EpochMetrics(epoch))
        elapsed = (time.perf_counter() - started) * 1e3
    finally:
        coordinator.close()
    if found is not None:
        raise RuntimeError(f"{job.job_id}: epoch {epoch} is decided already")
    return elapsed, epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--histories", default="10,10000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--build-only", action="store_true", help="build the histories only")
    parser.add_argument(
        "--measure-only",
        action="store_true",
        help="measure the histories as built so far (a build stopped early counts what it made)",
    )
    parser.add_argument("--chart", type=Path, help="also draw the medians into this PNG")
    parser.add_argument(
        "--folder", type=Path, default=CACHE / "start-cost", help="where local histories live"
    )
    args = parser.parse_args()
    requests.install()
    targets: Sequence[str] = [t for t in args.targets.split(",") if t]
    histories = sorted(int(h) for h in args.histories.split(","))
    args.folder.mkdir(parents=True, exist_ok=True)
    tempfile.tempdir = str(args.folder)
    results: dict[tuple[str, int], list[float]] = {}
    stores: dict[str, str] = {}
    building: dict[tuple[str, int], float] = {}
    behind: dict[tuple[str, int], int] = {}
    asked: dict[tuple[str, int], int] = {}
    made: dict[tuple[str, int], Job] = {}
    for target in targets:
        for history in histories:
            job = jobs(target, history, args.folder)
            stores[target] = job.store_name
            if not args.measure_only:
                started = time.perf_counter()
                added, per_epoch = build(job)
                print(
                    f"{job.job_id}: {added} epochs added in {time.perf_counter() - started:.1f} s",
                    flush=True,
                )
                if per_epoch is not None:
                    building[(target, history)] = per_epoch
            if args.build_only:
                continue
            made[(target, history)] = job
            timed_start(job)  # warm: imports, connections, the server's caches
        if args.build_only:
            continue
        # The histories' starts alternate, so that a change of the machine's load between
        # them weighs on each alike.
        for _ in range(args.repeats):
            for history in histories:
                requests.count = 0
                ms, epochs = timed_start(made[(target, history)])
                results.setdefault((target, history), []).append(ms)
                behind[(target, history)] = epochs
                asked[(target, history)] = requests.count
    if args.build_only:
        return
    low, high = histories[0], histories[-1]
    print(f"\nmedian of {args.repeats} starts (ms), load average {os.getloadavg()[0]:.1f}\n")
    heads = " | ".join(f"H = {h:,}" for h in histories)
    print(f"| sink | decision store | {heads} | ratio | S3 requests | runs at H = {high:,} |")
    print("|---|---|" + "---|" * len(histories) + "---|---|---|")
    for target in targets:
        medians = [statistics.median(results[(target, h)]) for h in histories]
        shown = ", ".join(f"{r:.0f}" for r in results[(target, high)])
        calls = " / ".join(str(asked[(target, h)]) for h in histories)
        cells = " | ".join(
            f"{m:.1f}" + ("" if behind[(target, h)] == h else f" ({behind[(target, h)]:,} epochs)")
            for m, h in zip(medians, histories, strict=True)
        )
        kind = target.removeprefix("store-") if not target.startswith("store-") else "files"
        ratio = medians[-1] / medians[0]
        print(f"| {kind} | {stores[target]} | {cells} | {ratio:.2f}x | {calls} | {shown} |")
    if building:
        print("\nbuilding: ms per epoch, median of the last 100 added")
        for (target, history), ms in sorted(building.items()):
            print(f"  {target} up to {history:,}: {ms:.1f}")
    if args.chart is not None:
        from benchmarks.charts import grouped_bar_chart

        written = grouped_bar_chart(
            args.chart,
            f"A job's start with {low:,} vs {high:,} epochs behind it (median ms)",
            list(targets),
            [
                (f"H = {h:,}", [statistics.median(results[(t, h)]) for t in targets])
                for h in histories
            ],
            "ms (lower is better)",
        )
        print(f"chart: {written}")


if __name__ == "__main__":
    main()
