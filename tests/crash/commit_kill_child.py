"""An executor-mode job in its own process whose driver dies in the middle of an epoch's
concurrent commits: `python -m tests.crash.commit_kill_child DSN TABLE JOB STORE --parts N
--kill-after K` prepares N parts of epoch 0 of a Postgres sink (as tasks do), decides the
epoch and SIGKILLs itself from a commit worker once K COMMIT PREPAREDs returned (the others
in flight or not begun). Without `--kill-after` it only starts a coordinator (recovery) and
exits. The DSN is read from the environment variable DS_CHILD_DSN (it holds a password)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa

from durable_sinks.coordinator import Coordinator, prepare_part
from durable_sinks.core import CommitHandle
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.postgres import Postgres, PostgresSink, committer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("table")
    parser.add_argument("job")
    parser.add_argument("store", type=Path)
    parser.add_argument("--parts", type=int, default=8)
    parser.add_argument("--kill-after", type=int)
    args = parser.parse_args(argv)
    dsn = os.environ["DS_CHILD_DSN"]

    def build() -> list[Any]:
        return [PostgresSink(Postgres(dsn, args.table, participants_in_flight=args.parts))]

    coordinator = Coordinator(
        args.job, build(), LocalDirectoryStore(args.store), executor_mode=True, source="q"
    )
    coordinator.start()
    if args.kill_after is None:
        coordinator.close()
        return 0
    committed = 0
    lock = threading.Lock()
    original = committer.commit_prepared

    def commit_then_maybe_die(*call: Any) -> Any:
        nonlocal committed
        outcome = original(*call)
        with lock:
            committed += 1
            if committed == args.kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
        return outcome

    committer.commit_prepared = commit_then_maybe_die  # type: ignore[assignment]

    def prepare(generation: int) -> list[CommitHandle]:
        handles: list[CommitHandle] = []
        for part in range(args.parts):
            rows = pa.record_batch({"id": pa.array(range(part * 10, part * 10 + 10), pa.int64())})
            handles += prepare_part(args.job, generation, 0, f"p{part}-t{part}", build, [rows])
        return handles

    coordinator.run_distributed_epoch(0, prepare)
    return 1  # never reached: the kill comes first


if __name__ == "__main__":
    sys.exit(main())
