"""`commit_epoch` of N prepared participants of a table sink: the live path against recovery's.

    .venv/bin/python -m benchmarks.live_commit [--sinks delta,iceberg] [--parts 8,32]
        [--rounds 5]

Needs the test bed's S3 (SeaweedFS; Iceberg: its REST catalog). For each sink and N, one
executor-mode epoch of N parts (1,000 rows each) is prepared by `prepare_part` as tasks do,
under generation 1; then two driver instances commit every participant with `commit_epoch`
(no publish: nothing becomes visible), alternating for `--rounds` rounds:
- live: opened as generation 1, the coordinator that prepared the epoch: each participant
  taken as its handle lists it;
- recovery: opened as generation 2, as after a restart: each participant's files checked to
  be there, one request per file.
Printed: the median of each over the rounds (ms for all N).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.cost_model import Target
from benchmarks.postgres_sink import make_rows
from durable_sinks.coordinator import prepare_part
from durable_sinks.core import CommitHandle, SinkConnector
from durable_sinks.core.protocol import OpenContext


def measure(kind: str, parts: list[int], rounds: int) -> None:
    target = Target(kind, Path(tempfile.mkdtemp(prefix="ds-live-")))
    spec = target.spec()
    job = f"live-{uuid.uuid4().hex[:6]}"
    batches = make_rows(1_000).to_batches(1_000)

    def build() -> list[SinkConnector]:
        return [spec.build()]

    try:
        for n in parts:
            epoch = n  # an epoch of its own per N
            handles: list[CommitHandle] = []
            for i in range(n):
                handles += prepare_part(job, 1, epoch, f"p{i}-t{i}", build, batches)
            sinks = {}
            for label, generation in (("live", 1), ("recovery", 2)):
                made = spec.build()
                made.open(OpenContext(job, made.name, generation))
                sinks[label] = made
            times: dict[str, list[float]] = {"live": [], "recovery": []}
            for round_ in range(rounds):
                order = ("live", "recovery") if round_ % 2 == 0 else ("recovery", "live")
                for label in order:
                    started = time.perf_counter()
                    for handle in handles:
                        sinks[label].commit_epoch(epoch, handle)
                    times[label].append((time.perf_counter() - started) * 1e3)
            for made in sinks.values():
                made.close()
            shown = ", ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in times.items())
            print(f"{kind}: N = {n}: {shown}", flush=True)
    finally:
        target.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sinks", default="delta,iceberg")
    parser.add_argument("--parts", default="8,32")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for kind in args.sinks.split(","):
        measure(kind, [int(n) for n in args.parts.split(",")], args.rounds)


if __name__ == "__main__":
    main()
