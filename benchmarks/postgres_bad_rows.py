"""What bad rows cost the Postgres sink: on_bad_rows="fail" vs "dead_letter" on a clean batch,
and a batch with bad rows against a clean one, through the coordinator (no Spark).

    .venv/bin/python -m benchmarks.postgres_bad_rows [--rows 100000] [--rounds 5]
        [--bad-fraction 0.01] [--batch-rows 100000]

Needs the test bed's Postgres (`python -m tests.services up postgres`). The target has what
makes rows bad: `id bigint PRIMARY KEY, parent bigint REFERENCES parents, name varchar(40)
NOT NULL, amount numeric(8,2), score double precision CHECK (score >= 0), at timestamptz`.
Each run writes one epoch of `--rows` rows, in record batches of `--batch-rows`, into a fresh
table (one-phase, the job's only target; with dead letters, a Postgres dead-letter table).
Runs, alternated in each round so that drift in the machine hits all alike, medians over the
rounds:

- clean, fail: on_bad_rows="fail" (no savepoint, no dead-letter sink);
- clean, dead_letter: the same rows with on_bad_rows="dead_letter" (goal: <= 3% more);
- 1 bad row (server), dead_letter: one row breaking the foreign key, one the check;
- bad rows, dead_letter: `--bad-fraction` of the rows bad, half of them found before COPY
  (NOT NULL, too long, numeric overflow), half by the server (check, foreign key), spread
  over the batch (goal: <= 1.5x the clean dead_letter run).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

from durable_sinks.coordinator import Coordinator
from durable_sinks.core.bad_rows import BadRowCap, BadRowPolicy, WritePolicy
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.services import Testbed

UTC = timezone.utc
SCHEMA = "bench_bad_rows"
PARENTS = 1000
TABLE_DDL = (
    "(id bigint PRIMARY KEY, parent bigint REFERENCES {schema}.parents (id), "
    "name varchar(40) NOT NULL, amount numeric(8,2), score double precision "
    "CHECK (score >= 0), at timestamptz)"
)


def make_rows(count: int, bad: dict[int, str]) -> pa.RecordBatch:
    """`count` good rows, except the rows of `bad` (row -> kind)."""
    rng = random.Random(11)
    start = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1e6)
    parent = [rng.randrange(PARENTS) for _ in range(count)]
    name: list[str | None] = [f"event {i % 1000:04d} lorem ipsum" for i in range(count)]
    amount = [Decimal(rng.randrange(100_000)) / 100 for _ in range(count)]
    score = [rng.random() for _ in range(count)]
    for row, kind in bad.items():
        if kind == "not_null":
            name[row] = None
        elif kind == "too_long":
            name[row] = "x" * 41
        elif kind == "out_of_range":
            amount[row] = Decimal("1000000.00")
        elif kind == "check":
            score[row] = -1.0
        elif kind == "foreign_key":
            parent[row] = PARENTS + row
    return pa.record_batch(
        {
            "id": pa.array(range(count), pa.int64()),
            "parent": pa.array(parent, pa.int64()),
            "name": pa.array(name, pa.string()),
            "amount": pa.array(amount, pa.decimal128(10, 2)),
            "score": pa.array(score, pa.float64()),
            "at": pa.array([start + i * 1000 for i in range(count)], pa.timestamp("us", "UTC")),
        }
    )


def spread(count: int, fraction: float, kinds: list[str]) -> dict[int, str]:
    """`fraction` of `count` rows, at random places, cycling through `kinds`."""
    rng = random.Random(5)
    rows = sorted(rng.sample(range(count), max(1, round(count * fraction))))
    return {row: kinds[i % len(kinds)] for i, row in enumerate(rows)}


def reset(conn: psycopg.Connection[Any]) -> None:
    """A fresh target; the dead-letter table (made by the first run with dead letters) is
    emptied, as a job's would be there already."""
    conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.events")
    if conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.dead_letters",)).fetchone() != (None,):
        conn.execute(f"TRUNCATE {SCHEMA}.dead_letters")
    conn.execute(f"CREATE TABLE {SCHEMA}.events {TABLE_DDL.format(schema=SCHEMA)}")
    conn.execute("CHECKPOINT")


def run(
    dsn: str, batch: pa.RecordBatch, store: Path, *, dead_letter: bool, batch_rows: int
) -> dict[str, float]:
    """One epoch of `batch`, in record batches of `batch_rows`: its seconds (whole epoch,
    write phase) and the sink's counters."""
    shutil.rmtree(store, ignore_errors=True)
    target = PostgresSink(Postgres(dsn, f"{SCHEMA}.events", name="events"))
    options: dict[str, Any] = {}
    if dead_letter:
        options = {
            "policy": WritePolicy(on_bad_rows=BadRowPolicy.DEAD_LETTER),
            "dead_letter": PostgresSink(
                Postgres(dsn, f"{SCHEMA}.dead_letters", name="dead_letters", create_table=True)
            ),
            "bad_row_cap": BadRowCap(0.5),
        }
    coordinator = Coordinator(
        f"bench-{uuid.uuid4().hex[:8]}", [target], LocalDirectoryStore(store), **options
    )
    coordinator.start()
    started = time.perf_counter()
    parts = [batch.slice(o, batch_rows) for o in range(0, batch.num_rows, batch_rows)]
    result = coordinator.run_epoch(0, parts)
    elapsed = time.perf_counter() - started
    metrics = target.metrics()
    coordinator.close()
    return {
        "seconds": elapsed,
        "write": result.metrics.seconds.get("write", 0.0),
        "rows": metrics["rows"],
        "refused": metrics["refused_rows"],
        "isolation_copies": metrics.get("isolation_copies", 0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bad-fraction", type=float, default=0.01)
    parser.add_argument("--batch-rows", type=int, default=100_000)
    args = parser.parse_args()
    dsn = Testbed.create().postgres.endpoint().conninfo()
    work = Path(tempfile.mkdtemp(prefix="ds-pg-bad-rows-"))
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.events, {SCHEMA}.dead_letters")
    conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.parents")
    conn.execute(f"CREATE TABLE {SCHEMA}.parents (id bigint PRIMARY KEY)")
    conn.execute(f"INSERT INTO {SCHEMA}.parents SELECT generate_series(0, {PARENTS - 1})")

    n = args.rows
    mixed = spread(
        n,
        args.bad_fraction,
        [
            "not_null",
            "check",
            "too_long",
            "foreign_key",
            "out_of_range",
            "check",
            "foreign_key",
            "not_null",
        ],
    )
    cases: dict[str, tuple[pa.RecordBatch, bool]] = {
        "clean, fail": (make_rows(n, {}), False),
        "clean, dead_letter": (make_rows(n, {}), True),
        "1 bad row (foreign key), dead_letter": (make_rows(n, {n // 2: "foreign_key"}), True),
        "1 bad row (check), dead_letter": (make_rows(n, {n // 2: "check"}), True),
        f"{args.bad_fraction:.1%} bad rows (mixed), dead_letter": (make_rows(n, mixed), True),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    for round_ in range(args.rounds):
        for name, (batch, dead_letter) in cases.items():
            reset(conn)
            store = work / f"store-{round_}"
            results[name].append(
                run(dsn, batch, store, dead_letter=dead_letter, batch_rows=args.batch_rows)
            )

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    print(
        f"{n:,} rows per epoch in batches of {args.batch_rows:,} (bigint PK, FK, varchar(40) "
        f"NOT NULL, numeric(8,2), float8 CHECK, timestamptz), one-phase; medians of "
        f"{args.rounds} rounds"
    )
    clean_fail = median("clean, fail", "seconds")
    clean_dl = median("clean, dead_letter", "seconds")
    for name in cases:
        seconds = median(name, "seconds")
        runs = ", ".join(f"{r['seconds']:.3f}" for r in results[name])
        # The same ratios paired by round (runs of one round are seconds apart): steadier
        # than a ratio of medians on a machine whose load drifts.
        paired_fail = statistics.median(
            r["seconds"] / c["seconds"]
            for r, c in zip(results[name], results["clean, fail"], strict=True)
        )
        paired_dl = statistics.median(
            r["seconds"] / c["seconds"]
            for r, c in zip(results[name], results["clean, dead_letter"], strict=True)
        )
        print(
            f"{name:<42} {seconds:6.3f} s (write {median(name, 'write'):.3f} s)  "
            f"x{seconds / clean_fail:.2f} clean fail, x{seconds / clean_dl:.2f} clean "
            f"dead_letter (paired by round: x{paired_fail:.2f}, x{paired_dl:.2f}); rows "
            f"{median(name, 'rows'):,.0f}, refused {median(name, 'refused'):,.0f}, refused "
            f"COPYs {median(name, 'isolation_copies'):,.0f}  runs {runs}"
        )
    conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.events, {SCHEMA}.dead_letters, {SCHEMA}.parents")
    conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
