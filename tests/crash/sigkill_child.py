"""A job in its own process, for SIGKILL tests: epochs into two file sinks, as Spark would run
them. `python -m tests.crash.sigkill_child ROOT --epochs N [--crash-at STEP --crash-epoch E]`.

Like Spark's checkpoint, `ROOT/commits/<epoch>` is written after an epoch's function returns;
on start the job resumes at the first epoch without one (replaying a crashed epoch with the
same batch id and the same data). With `--crash-at`, the process SIGKILLs itself right after
the coordinator step of that name (prefix match) in epoch `--crash-epoch`, or during start-up
for `recovery:*` steps; `after-run` is after the epoch returned but before its commit entry.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
from pathlib import Path

import pyarrow as pa

from durable_sinks.coordinator import Coordinator
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.testing import COLUMNS, SCHEMA

SINKS = ("a", "b")


def epoch_batches(epoch: int, rows: int = 200, batches: int = 3) -> list[pa.RecordBatch]:
    """The epoch's data: the same every time it is asked for (Spark replays deterministically)."""
    rng = random.Random(epoch)
    out = []
    for b in range(batches):
        records = [
            {
                "key": f"{epoch}:{b}:{r}",
                "n": rng.randrange(-(10**12), 10**12),
                "text": rng.choice([None, "", "ünïcödé", "x" * rng.randrange(50)]),
                "x": rng.choice([None, rng.random()]),
                "flag": rng.choice([None, True, False]),
            }
            for r in range(rows)
        ]
        out.append(pa.RecordBatch.from_pylist(records, SCHEMA))
    return out


def expected_rows(epochs: int, rows: int = 200) -> list[tuple[object, ...]]:
    return [
        tuple(row[c] for c in COLUMNS)
        for epoch in range(epochs)
        for batch in epoch_batches(epoch, rows)
        for row in batch.to_pylist()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--rows", type=int, default=200, help="rows per batch (3 batches)")
    parser.add_argument("--crash-at")
    parser.add_argument("--crash-epoch", type=int)
    parser.add_argument("--background-commits", action="store_true")
    args = parser.parse_args(argv)
    root: Path = args.root
    commits = root / "commits"
    commits.mkdir(parents=True, exist_ok=True)
    current: dict[str, int | None] = {"epoch": None}

    def maybe_crash(step: str) -> None:
        if args.crash_at is None or not step.startswith(args.crash_at):
            return
        recovery = step.startswith("recovery:")
        if recovery or current["epoch"] == args.crash_epoch:
            os.kill(os.getpid(), signal.SIGKILL)

    coordinator = Coordinator(
        "sigkill",
        [FolderSink(Files(str(root / name), name=name)) for name in SINKS],
        LocalDirectoryStore(root / "store"),
        on_step=maybe_crash,
        background_commits=args.background_commits,
    )
    coordinator.start()
    epoch = 0
    while (commits / str(epoch)).exists():
        epoch += 1
    while epoch < args.epochs:
        current["epoch"] = epoch
        coordinator.run_epoch(epoch, epoch_batches(epoch, args.rows))
        maybe_crash("after-run")
        (commits / str(epoch)).write_text("done")
        epoch += 1
    coordinator.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
