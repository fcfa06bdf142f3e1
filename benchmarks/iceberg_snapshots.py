"""How an Iceberg epoch's commit grows with the table's snapshots, with and without
`keep_snapshots`.

    .venv/bin/python -m benchmarks.iceberg_snapshots [--at 10,100,200] [--keep 10]

Needs the test bed's Postgres (a SQL catalog in a schema of its own, a local warehouse). Per
variant (the sink without `keep_snapshots`, then with `--keep`), a fresh table and a
driver-mode Coordinator run one-row epochs; when the table has reached each count of `--at`
epochs, 10 more epochs are timed: the median of the coordinator's commit phase (the epoch's
one Iceberg commit, and with `--keep` the house-keeping when it falls due), beside the
table's snapshots, the current snapshot's manifests and the size of its metadata file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import pyarrow as pa

from durable_sinks.coordinator import Coordinator
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks import create
from tests.services import up
from tests.support.iceberg_target import IcebergCatalog

TIMED = 10


def variant(keep: int | None, marks: list[int]) -> None:
    work = Path(tempfile.mkdtemp(prefix="ds-snapshots-"))
    catalog = IcebergCatalog(up(["postgres"]).postgres.endpoint(), work)
    catalog.create_namespace()
    batch = pa.record_batch({"id": pa.array([1], pa.int64()), "body": pa.array(["x"])})
    catalog.catalog().create_table(catalog.identifier(), schema=batch.schema)
    options = catalog.sink_options() | ({} if keep is None else {"keep_snapshots": keep})
    job = Coordinator("snapshots", [create("iceberg", options)], LocalDirectoryStore(work / "s"))
    job.start()
    epoch = 0
    try:
        for mark in marks:
            while epoch < mark:
                job.run_epoch(epoch, [batch])
                epoch += 1
            times = []
            for _ in range(TIMED):
                result = job.run_epoch(epoch, [batch])
                times.append(result.metrics.seconds.get("commit", 0.0) * 1e3)
                epoch += 1
            table = catalog.catalog().load_table(catalog.identifier())
            current = table.current_snapshot()
            manifests = len(current.manifests(table.io)) if current is not None else 0
            size = os.path.getsize(table.metadata_location.removeprefix("file://"))
            label = "no keep_snapshots" if keep is None else f"keep_snapshots={keep}"
            print(
                f"{label}, after {mark} epochs: {len(table.snapshots())} snapshots, "
                f"{manifests} manifests, metadata file {size / 1024:.0f} KB: commit median "
                f"{statistics.median(times):.1f} ms (min {min(times):.1f}, max {max(times):.1f})",
                flush=True,
            )
    finally:
        job.close()
        catalog.drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--at", default="10,100,200")
    parser.add_argument("--keep", type=int, default=10)
    args = parser.parse_args()
    marks = [int(n) for n in args.at.split(",")]
    variant(None, marks)
    variant(args.keep, marks)


if __name__ == "__main__":
    main()
