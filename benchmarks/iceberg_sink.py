"""Our Iceberg sink vs pyiceberg's own `table.append` of the same batches, in one run.

    .venv/bin/python -m benchmarks.iceberg_sink   # --rounds 3 --chart PNG
        # --shapes 10x100000/10000,3x1000000/100000 --variants pyiceberg,ours,...

Needs the test bed's Postgres (`python -m tests.services up postgres`): every run's table is
in a SQL catalog of its own (a fresh Postgres schema) with a local warehouse folder, or with
`--target s3` a warehouse prefix in the test bed's S3 bucket (SeaweedFS; `up s3`), reached
through pyiceberg's `s3.*` FileIO properties.

The input, per shape `EPOCHSxROWS/BATCH`: EPOCHS epochs of ROWS rows each, every epoch
handed over as record batches of BATCH rows (id bigint, ts timestamp[us, UTC], user string,
amount double, payload string of ~80 bytes), made once. Variants, each into a fresh table
created (untimed) with the rows' schema and the same table properties, alternating for
`--rounds` rounds (forward, backward, ...):
- pyiceberg: one `table.append(pa.Table.from_batches(epoch's batches))` per epoch: pyiceberg
  writing the epoch's data files and committing a snapshot, not exactly-once (a replayed
  epoch is appended again);
- ours: a Coordinator with `IcebergSink` and a local-directory decision store, one
  `run_epoch(epoch, batches)` per epoch: the data files written by the sink, the decision
  fsynced, one Iceberg commit with the epoch property and snapshot summary;
- ours-background: ours with `background_commits`: each epoch's Iceberg commit runs while
  the next epoch is written; the last epoch's commit, which `close()` waits for, is counted
  in the last epoch;
- ours-no-replay-check (a diagnostic): the same with `replay_check="off"`, without the
  content digest the coordinator keeps of each epoch to recognise a replay whose rows
  differ;
- files only (a floor): pyiceberg's writer alone (the Parquet encoding and the file write of
  the epoch as one table, the data file records built), nothing committed;
- commit only (a floor): a bare catalog commit per epoch (one table property set): the
  catalog's round trips and the metadata file it writes, no data.
Timed: each epoch (per-epoch medians over every epoch of every round); a run's total is the
sum of its epochs. Every run is checked before the next: a pyiceberg scan reads back exactly
EPOCHS x ROWS distinct ids (the floors: the files' row counts); ours has one snapshot per
epoch with the epoch in its summary and no data file outside the current snapshot; and the
data files of ours and pyiceberg's are compared (files per epoch, codec, row groups).
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from durable_sinks.coordinator import Coordinator
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks import create
from tests.services import PostgresEndpoint, S3Endpoint, Testbed
from tests.support.iceberg_target import IcebergCatalog

PEER = "pyiceberg"
FLOORS = ("files only", "commit only")
#: Per variant of ours, each epoch's seconds per coordinator phase (EpochMetrics.seconds).
PHASES: dict[str, list[dict[str, float]]] = {}


@dataclass(frozen=True)
class Shape:
    epochs: int
    rows: int
    batch_rows: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        count, rest = text.split("x", 1)
        rows, batch = rest.split("/", 1) if "/" in rest else (rest, rest)
        return cls(int(count), int(rows), int(batch))

    def __str__(self) -> str:
        return f"{self.epochs} x {self.rows:,} rows in record batches of {self.batch_rows:,}"


def make_epochs(shape: Shape) -> list[list[pa.RecordBatch]]:
    epochs = []
    for epoch in range(shape.epochs):
        start = epoch * shape.rows
        ids = pa.array(range(start, start + shape.rows), pa.int64())
        rows = pa.record_batch(
            {
                "id": ids,
                "ts": pc.cast(pc.multiply(ids, 1000), pa.timestamp("us", "UTC")),
                "user": pc.cast(pc.bit_wise_and(ids, 1023), pa.string()),
                "amount": pc.divide(pc.cast(ids, pa.float64()), 7.0),
                "payload": pc.binary_join_element_wise(
                    "payload ", pc.cast(ids, pa.string()), "." * 64, ""
                ),
            }
        )
        epochs.append(
            [rows.slice(at, shape.batch_rows) for at in range(0, shape.rows, shape.batch_rows)]
        )
    return epochs


@dataclass
class Run:
    """One variant's run: each epoch's seconds and what its files look like."""

    seconds: list[float]
    files: int = 0
    row_groups: int = 0
    codecs: set[str] = field(default_factory=set)

    @property
    def total(self) -> float:
        return sum(self.seconds)


class S3Catalog(IcebergCatalog):
    """A SQL catalog whose warehouse is a prefix of the test bed's S3 bucket."""

    def __init__(self, postgres: PostgresEndpoint, folder: Path, s3: S3Endpoint) -> None:
        super().__init__(postgres, folder)
        self.s3 = s3
        self.prefix = f"iceberg-bench-{uuid.uuid4().hex[:8]}"

    def properties(self, **overrides: str) -> dict[str, str]:
        return super().properties(
            **{
                "warehouse": f"s3://{self.s3.bucket}/{self.prefix}",
                "s3.endpoint": self.s3.endpoint_url,
                "s3.region": self.s3.region,
                "s3.access-key-id": self.s3.access_key_id,
                "s3.secret-access-key": self.s3.secret_access_key,
                "s3.force-virtual-addressing": "false",
                **overrides,
            }
        )


class Place:
    """A SQL catalog per run (a fresh schema in the test bed's Postgres), its tables' data
    under one temporary warehouse folder or, for `target` "s3", a prefix of the S3 bucket."""

    def __init__(self, target: str) -> None:
        testbed = Testbed.create()
        self.postgres = testbed.postgres.endpoint()
        self.s3 = testbed.s3.endpoint() if target == "s3" else None
        self.root = Path(tempfile.mkdtemp(prefix="ds-iceberg-bench-"))

    def catalog(self) -> IcebergCatalog:
        folder = self.root / uuid.uuid4().hex[:8]
        made = (
            IcebergCatalog(self.postgres, folder)
            if self.s3 is None
            else S3Catalog(self.postgres, folder, self.s3)
        )
        made.create_namespace()
        return made

    def cleanup(self, catalog: IcebergCatalog) -> None:
        catalog.drop()
        shutil.rmtree(catalog.warehouse.parent, ignore_errors=True)
        if isinstance(catalog, S3Catalog):
            from tests.support.s3_objects import delete_prefix

            delete_prefix(catalog.s3.client(), catalog.s3.bucket, catalog.prefix + "/")


def new_table(catalog: IcebergCatalog, schema: pa.Schema) -> Any:
    return catalog.catalog().create_table(("ds", "events"), schema=schema)


def run_pyiceberg(catalog: IcebergCatalog, epochs: list[list[pa.RecordBatch]]) -> list[float]:
    table = new_table(catalog, epochs[0][0].schema)
    seconds = []
    for batches in epochs:
        start = time.perf_counter()
        table.append(pa.Table.from_batches(batches))
        seconds.append(time.perf_counter() - start)
    return seconds


def run_ours(
    catalog: IcebergCatalog,
    epochs: list[list[pa.RecordBatch]],
    replay_check: str = "warn",
    background_commits: bool = False,
) -> list[float]:
    new_table(catalog, epochs[0][0].schema)
    store = catalog.warehouse.parent / "decisions"
    coordinator = Coordinator(
        f"bench-{uuid.uuid4().hex[:8]}",
        [create("iceberg", catalog.sink_options())],
        LocalDirectoryStore(store),
        replay_check=replay_check,
        background_commits=background_commits,
    )
    seconds = []
    name = "ours" if replay_check != "off" else "ours-no-replay-check"
    phases = PHASES.setdefault(name + ("-background" if background_commits else ""), [])
    try:
        coordinator.start()
        for epoch, batches in enumerate(epochs):
            start = time.perf_counter()
            result = coordinator.run_epoch(epoch, batches)
            seconds.append(time.perf_counter() - start)
            phases.append(dict(result.metrics.seconds))
    finally:
        start = time.perf_counter()
        coordinator.close()  # with background commits: the last epoch's commit ends here
        if background_commits and seconds:
            seconds[-1] += time.perf_counter() - start
    return seconds


def run_ours_background(catalog: IcebergCatalog, epochs: list[list[pa.RecordBatch]]) -> list[float]:
    return run_ours(catalog, epochs, background_commits=True)


def run_ours_unchecked(catalog: IcebergCatalog, epochs: list[list[pa.RecordBatch]]) -> list[float]:
    return run_ours(catalog, epochs, replay_check="off")


def run_files_only(catalog: IcebergCatalog, epochs: list[list[pa.RecordBatch]]) -> list[float]:
    from durable_sinks.sinks.iceberg import _pyiceberg

    table = new_table(catalog, epochs[0][0].schema)
    seconds = []
    for batches in epochs:
        start = time.perf_counter()
        _pyiceberg.write_data_files(
            table, pa.Table.from_batches(batches), uuid.uuid4(), itertools.count(0)
        )
        seconds.append(time.perf_counter() - start)
    return seconds


def run_commit_only(catalog: IcebergCatalog, epochs: list[list[pa.RecordBatch]]) -> list[float]:
    table = new_table(catalog, epochs[0][0].schema)
    seconds = []
    for epoch, _ in enumerate(epochs):
        start = time.perf_counter()
        with table.transaction() as tx:
            tx.set_properties({"bench.epoch": str(epoch)})
        seconds.append(time.perf_counter() - start)
    return seconds


VARIANTS: dict[str, Callable[[IcebergCatalog, list[list[pa.RecordBatch]]], list[float]]] = {
    PEER: run_pyiceberg,
    "ours": run_ours,
    "ours-background": run_ours_background,
    "ours-no-replay-check": run_ours_unchecked,
    "files only": run_files_only,
    "commit only": run_commit_only,
}


def check(catalog: IcebergCatalog, shape: Shape, variant: str, run: Run) -> None:
    """Raise AssertionError unless the run left what it should; fill in its files' shape."""
    from durable_sinks.sinks.iceberg import _pyiceberg

    expected = shape.epochs * shape.rows
    table = catalog.catalog().load_table(("ds", "events"))
    found = sorted(_pyiceberg.list_files(table, table.location().rstrip("/") + "/data"))

    def parquet(path: str) -> pq.FileMetaData:
        with table.io.new_input(path).open() as stream:
            return pq.ParquetFile(stream).metadata

    for path in found:
        metadata = parquet(path)
        run.row_groups += metadata.num_row_groups
        run.codecs |= {
            metadata.row_group(g).column(c).compression
            for g in range(metadata.num_row_groups)
            for c in range(metadata.num_columns)
        }
    run.files = len(found)
    if variant == "commit only":
        return
    if variant == "files only":
        rows = sum(parquet(p).num_rows for p in found)
        if rows != expected:
            raise AssertionError(f"{variant}: {rows} rows in its files, expected {expected}")
        return
    ids = table.scan(selected_fields=("id",)).to_arrow().column("id")
    if len(ids) != expected or pc.count_distinct(ids).as_py() != expected:
        raise AssertionError(f"{variant}: {len(ids)} rows, expected {expected} distinct")
    if variant.startswith("ours"):
        epochs = sorted(
            int(s.summary["durable-sinks.epoch"])
            for s in table.snapshots()
            if s.summary is not None and "durable-sinks.epoch" in s.summary
        )
        if epochs != list(range(shape.epochs)) or len(table.snapshots()) != shape.epochs:
            raise AssertionError(f"{variant}: snapshots by epoch {epochs}")
        held = {str(t.file.file_path) for t in table.scan().plan_files()}
        orphans = [p for p in found if p not in held]
        if orphans:
            raise AssertionError(f"{variant}: data files in no snapshot: {orphans}")


def measure(
    place: Place, shape: Shape, rounds: int, variants: list[str], target: str
) -> dict[str, list[Run]]:
    epochs = make_epochs(shape)
    megabytes = sum(b.nbytes for batches in epochs for b in batches) / 1e6
    print(f"\n{shape} ({megabytes:.0f} MB in Arrow), warehouse {target}, {rounds} rounds")
    # A warm-up of each (library loading, the first catalog), not timed.
    for name in variants:
        catalog = place.catalog()
        try:
            VARIANTS[name](catalog, epochs[:1])
        finally:
            place.cleanup(catalog)
    PHASES.clear()
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    for round_ in range(rounds):
        for name in variants if round_ % 2 == 0 else variants[::-1]:
            catalog = place.catalog()
            try:
                run = Run(VARIANTS[name](catalog, epochs))
                check(catalog, shape, name, run)
            finally:
                place.cleanup(catalog)
            runs[name].append(run)
            print(
                f"round {round_ + 1}: {name:22s} {run.total:7.3f} s  (epochs: median "
                f"{statistics.median(run.seconds) * 1e3:7.1f} ms)"
            )
    report(shape, runs)
    return runs


def per_epoch(runs: list[Run]) -> float:
    return statistics.median(s for run in runs for s in run.seconds)


def report(shape: Shape, runs: dict[str, list[Run]]) -> None:
    rows = shape.epochs * shape.rows
    print(
        f"\n| Variant | Median per epoch | Median per run | Rows/s | Files per epoch "
        f"| Row groups per file | Codec | vs {PEER} (per round) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    peer = runs.get(PEER)
    for name, done in runs.items():
        epoch = per_epoch(done)
        total = statistics.median(r.total for r in done)
        last = done[-1]
        ratio = ""
        if peer is not None and name not in FLOORS:
            per_round = statistics.median(
                p.total / m.total for p, m in zip(peer, done, strict=True)
            )
            ratio = f"{per_epoch(peer) / epoch:.2f}x ({per_round:.2f}x)"
        groups = f"{last.row_groups / last.files:.1f}" if last.files else "-"
        print(
            f"| {name} | {epoch * 1e3:.1f} ms | {total:.3f} s | "
            f"{rows / total / 1e6:.2f} M | {last.files / shape.epochs:g} | {groups} | "
            f"{','.join(sorted(last.codecs)) or '-'} | {ratio} |"
        )
    if all(f in runs for f in FLOORS):
        floor = per_epoch(runs["files only"]) + per_epoch(runs["commit only"])
        print(f"floor (files only + commit only): {floor * 1e3:.1f} ms per epoch")
        for name in (n for n in runs if n not in FLOORS):
            print(f"  {name}: {per_epoch(runs[name]) / floor:.2f}x the floor's time")
    for name, epochs in PHASES.items():
        if name in runs and epochs:
            shown = ", ".join(
                f"{phase} {statistics.median(e.get(phase, 0.0) for e in epochs) * 1e3:.1f}"
                for phase in epochs[0]
            )
            print(f"{name}, median ms per epoch by phase: {shown}")
    PHASES.clear()
    if peer is not None and "ours" in runs:
        ours, theirs = runs["ours"][-1], peer[-1]
        if (ours.files, ours.codecs) != (theirs.files, theirs.codecs):
            print(
                f"NOTE: the files differ: ours {ours.files} ({sorted(ours.codecs)}), "
                f"{PEER} {theirs.files} ({sorted(theirs.codecs)})"
            )


def chart(results: dict[Shape, dict[str, list[Run]]], path: Path) -> None:
    from benchmarks.charts import RATIO, grouped_bar_chart

    labels = [n for n in VARIANTS if n != PEER and n not in FLOORS]
    series = []
    for shape, runs in results.items():
        if PEER not in runs:
            continue
        values: list[float | None] = [
            per_epoch(runs[PEER]) / per_epoch(runs[n]) if n in runs else None for n in labels
        ]
        series.append((f"{shape.epochs} x {shape.rows:,} rows", values))
    written = grouped_bar_chart(
        path,
        "Iceberg sink: throughput against pyiceberg's table.append of the same epochs "
        "(per-epoch medians, SQL catalog on Postgres, local warehouse)",
        labels,
        series,
        f"x {PEER}'s throughput",
        highlight=["ours"],
        references=[(f"{PEER} (1x)", 1.0), ("goal 0.9x", 0.9)],
        value_format=RATIO,
    )
    print(f"chart: {written}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--shapes",
        default="10x100000/10000,3x1000000/100000",
        help="comma-separated EPOCHSxROWS/BATCH_ROWS",
    )
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--target", choices=("local", "s3"), default="local")
    parser.add_argument("--chart", type=Path, default=None)
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    place = Place(args.target)
    try:
        results = {
            shape: measure(place, shape, args.rounds, variants, args.target)
            for shape in map(Shape.parse, args.shapes.split(","))
        }
    finally:
        shutil.rmtree(place.root, ignore_errors=True)
    if args.chart is not None:
        chart(results, args.chart)


if __name__ == "__main__":
    main()
