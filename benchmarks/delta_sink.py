"""Our Delta sink vs `deltalake.write_deltalake` of the same batches, in one run.

    .venv/bin/python -m benchmarks.delta_sink   # --rounds 3 --epochs 10 --rows 100000
                                                # --target local|s3

The input: `--epochs` Arrow batches of `--rows` rows (id bigint, ts timestamp[us, UTC], user
string, amount double, payload string of ~80 bytes), made once. Variants, each into a fresh
table, alternating for `--rounds` rounds (forward, backward, ...):
- write_deltalake: one `write_deltalake(path, batch, mode="append")` per batch (the first
  creates the table): delta-rs writing and committing, not exactly-once (a replayed batch is
  appended again);
- ours: a Coordinator with `DeltaSink(create_table=True)` and a local-directory decision
  store, one `run_epoch` per batch: the Parquet file written and fsynced (local) under the
  table, the participant's journal, the decision fsynced, the Delta commit with the job's
  application transaction, the journal deleted;
- ours-no-replay-check (a diagnostic): the same with `replay_check="off"`: without the
  content digest of every batch that the coordinator keeps to recognise a replay whose rows
  differ (docs/guide.md), which write_deltalake does not compute;
- ours-background: ours with `background_commits`: each epoch's log commit runs while the
  next epoch is written; timed until `close()` returns, when every epoch is committed.
Both write zstd level 1 (Arrow's default level; delta-rs is given it). Timed: every batch of
the run, table creation included. Every run is checked before the next: delta-rs reads the
table back with exactly epochs x rows rows and distinct ids; ours' log has one commit per
epoch. `--target s3` writes to the test bed's S3 server (SeaweedFS) instead of a temporary
folder. Prints the medians and each variant's ratio to write_deltalake (throughput of ours /
write_deltalake's), also as the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from durable_sinks.coordinator import Coordinator
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.delta import Delta, DeltaSink


def make_batches(epochs: int, rows: int) -> list[pa.RecordBatch]:
    batches = []
    for epoch in range(epochs):
        ids = pa.array(range(epoch * rows, (epoch + 1) * rows), pa.int64())
        batches.append(
            pa.record_batch(
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
        )
    return batches


class Place:
    """Where one run's table goes: a temporary folder, or a prefix of the test bed's S3."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.s3: Any = None
        if target == "s3":
            from tests.services import Testbed, up

            testbed = Testbed.create()
            up(["s3"], testbed)
            self.s3 = testbed.s3.endpoint()
        self.root = Path(tempfile.mkdtemp(prefix="ds-delta-bench-"))

    def table(self, variant: str) -> tuple[str, dict[str, Any], dict[str, str]]:
        """(path, our sink's connection options, delta-rs's storage options)."""
        name = f"{variant}-{uuid.uuid4().hex[:8]}"
        if self.s3 is None:
            return str(self.root / name), {}, {}
        from tests.support.delta_target import delta_s3_options, storage_options

        path = f"s3://{self.s3.bucket}/bench-{name}"
        ours = delta_s3_options(self.s3, path)
        del ours["path"]
        return path, ours, storage_options(self.s3)

    def cleanup(self, path: str) -> None:
        if self.s3 is None:
            shutil.rmtree(path, ignore_errors=True)
            return
        from tests.support.s3_objects import delete_prefix

        delete_prefix(self.s3.client(), self.s3.bucket, path.split("/", 3)[3] + "/")


def run_write_deltalake(
    batches: list[pa.RecordBatch], path: str, _ours: dict[str, Any], storage: dict[str, str]
) -> None:
    from deltalake import WriterProperties, write_deltalake

    properties = WriterProperties(compression="ZSTD", compression_level=1)
    for batch in batches:
        write_deltalake(
            path,
            pa.Table.from_batches([batch]),
            mode="append",
            storage_options=storage,
            writer_properties=properties,
        )


def run_ours(
    batches: list[pa.RecordBatch],
    path: str,
    ours: dict[str, Any],
    _storage: dict[str, str],
    replay_check: str = "warn",
    background_commits: bool = False,
) -> None:
    store = Path(tempfile.mkdtemp(prefix="ds-delta-bench-store-"))
    sink = DeltaSink(Delta(path=path, create_table=True, **ours))
    coordinator = Coordinator(
        f"bench-{uuid.uuid4().hex[:8]}",
        [sink],
        LocalDirectoryStore(store),
        replay_check=replay_check,
        background_commits=background_commits,
    )
    try:
        coordinator.start()
        for epoch, batch in enumerate(batches):
            coordinator.run_epoch(epoch, [batch])
    finally:
        coordinator.close()
        shutil.rmtree(store, ignore_errors=True)


def check(path: str, storage: dict[str, str], epochs: int, rows: int, variant: str) -> None:
    from deltalake import DeltaTable

    table = DeltaTable(path, storage_options=storage)
    ids = pa.table(table.to_pyarrow_table(columns=["id"])).column("id")
    if len(ids) != epochs * rows or pc.count_distinct(ids).as_py() != epochs * rows:
        raise AssertionError(f"{variant}: {len(ids)} rows, expected {epochs * rows} distinct")
    if variant.startswith("ours"):
        epochs_seen = [
            h.get("durable_sinks.epoch") for h in table.history() if "durable_sinks.epoch" in h
        ]
        if sorted(int(str(e)) for e in epochs_seen) != list(range(epochs)):
            raise AssertionError(f"ours: commits by epoch {epochs_seen}")


def run_ours_unchecked(
    batches: list[pa.RecordBatch], path: str, ours: dict[str, Any], storage: dict[str, str]
) -> None:
    run_ours(batches, path, ours, storage, replay_check="off")


def run_ours_background(
    batches: list[pa.RecordBatch], path: str, ours: dict[str, Any], storage: dict[str, str]
) -> None:
    run_ours(batches, path, ours, storage, background_commits=True)


VARIANTS: dict[str, Callable[..., None]] = {
    "write_deltalake": run_write_deltalake,
    "ours": run_ours,
    "ours-background": run_ours_background,
    "ours-no-replay-check": run_ours_unchecked,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--target", choices=("local", "s3"), default="local")
    args = parser.parse_args()
    batches = make_batches(args.epochs, args.rows)
    place = Place(args.target)
    megabytes = sum(b.nbytes for b in batches) / 1e6
    print(
        f"{args.epochs} epochs x {args.rows} rows ({megabytes:.0f} MB in Arrow), "
        f"target {args.target}, {args.rounds} rounds"
    )
    # A warm-up of each (library loading, first table), not timed.
    for name, run in VARIANTS.items():
        path, ours, storage = place.table(name)
        run(batches[:1], path, ours, storage)
        place.cleanup(path)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_ in range(args.rounds):
        order = list(VARIANTS.items())
        for name, run in order if round_ % 2 == 0 else order[::-1]:
            path, ours, storage = place.table(name)
            start = time.perf_counter()
            run(batches, path, ours, storage)
            seconds = time.perf_counter() - start
            check(path, storage, args.epochs, args.rows, name)
            place.cleanup(path)
            times[name].append(seconds)
            print(f"round {round_ + 1}: {name:16s} {seconds:7.3f} s")
    medians = {name: statistics.median(t) for name, t in times.items()}
    rows = args.epochs * args.rows
    for name, seconds in medians.items():
        print(f"median {name:16s} {seconds:7.3f} s  {rows / seconds / 1e6:5.2f} M rows/s")
    for name in (n for n in medians if n != "write_deltalake"):
        ratio = medians["write_deltalake"] / medians[name]
        per_round = statistics.median(
            peer / mine for peer, mine in zip(times["write_deltalake"], times[name], strict=True)
        )
        print(
            f"{name} / write_deltalake throughput: {ratio:.2f}x (median of per-round ratios "
            f"{per_round:.2f}x; goal >= 0.9x)"
        )
    shutil.rmtree(place.root, ignore_errors=True)


if __name__ == "__main__":
    main()
