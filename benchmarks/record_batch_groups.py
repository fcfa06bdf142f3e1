"""What joining Spark's record batches into groups saves a Postgres epoch, without Spark.

    .venv/bin/python -m benchmarks.record_batch_groups [--rows 100000] [--record-rows 10000]
        [--rounds 12] [--chart PNG]

Needs the test bed's Postgres. One epoch of benchmarks/postgres_sink.py's rows (bigint, text,
float8, timestamptz), cut into record batches of `--record-rows` rows as Spark's
collect-as-Arrow socket sends them (`spark.sql.execution.arrow.maxRecordsPerBatch`, 10,000 by
default), is written by a started coordinator with one Postgres sink (driver mode's
exactly-once path: one-phase commit, decision in the sink's database), either as those
record batches (one COPY each) or through `_arrow.grouped` (driver mode's default: groups of
up to GROUP_ROWS rows, one COPY each). The two alternate for `--rounds` rounds, each run after
a Postgres CHECKPOINT; the first two rounds are a warm-up. The table's rows are checked at the
end (every epoch's rows once).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from benchmarks.postgres_sink import make_rows
from durable_sinks.spark import sink
from durable_sinks.spark._arrow import GROUP_ROWS, grouped
from durable_sinks.spark._build import build_coordinator
from durable_sinks.spark._options import JobOptions
from tests.services import up

WARM_UP = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--record-rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--chart", type=Path, help="also draw both medians into this PNG")
    args = parser.parse_args()
    if args.rounds <= WARM_UP:
        parser.error(f"--rounds must be more than the {WARM_UP} warm-up rounds")
    pg = up(["postgres"]).postgres.endpoint()
    admin = psycopg.connect(pg.conninfo(), autocommit=True)
    schema = f"groups_{uuid.uuid4().hex[:8]}"
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    batches = make_rows(args.rows).to_batches(args.record_rows)
    spec = sink("postgres", dsn=pg.conninfo(), table=f"{schema}.t", create_table=True)
    coordinator = build_coordinator([spec], JobOptions(job_id=f"groups-{uuid.uuid4().hex[:8]}"))
    coordinator.start()
    labels = {
        "record": f"Spark's record batches of {args.record_rows:,} rows, one COPY each",
        "grouped": f"grouped (up to {GROUP_ROWS:,} rows), one COPY each",
    }
    runs: dict[str, list[float]] = {name: [] for name in labels}
    epoch = 0
    try:
        for round_ in range(args.rounds):
            for name in list(labels) if round_ % 2 == 0 else list(labels)[::-1]:
                admin.execute("CHECKPOINT")
                source = iter(batches) if name == "record" else grouped(iter(batches))
                started = time.perf_counter()
                coordinator.run_epoch(epoch, source)
                runs[name].append((time.perf_counter() - started) * 1e3)
                epoch += 1
    finally:
        coordinator.close()
    row = admin.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "t"))
    ).fetchone()
    if row is None or row[0] != args.rows * epoch:
        raise RuntimeError(f"{row} rows after {epoch} epochs of {args.rows}")
    admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    kept = {name: times[WARM_UP:] for name, times in runs.items()}
    print(
        f"\none epoch of {args.rows:,} rows into Postgres (one-phase exactly-once), "
        f"{args.rounds - WARM_UP} rounds after {WARM_UP} of warm-up, alternated\n"
    )
    print("| record batches | median | best | runs (ms) |\n|---|---|---|---|")
    for name, times in kept.items():
        print(
            f"| {labels[name]} | {statistics.median(times):.1f} ms | {min(times):.1f} ms | "
            + ", ".join(f"{t:.0f}" for t in times)
            + " |"
        )
    paired = statistics.median(r / g for r, g in zip(kept["record"], kept["grouped"], strict=True))
    print(f"\nrecord batches / grouped: median of the paired ratios {paired:.2f}x")
    if args.chart is not None:
        from benchmarks.charts import bar_chart

        written = bar_chart(
            args.chart,
            f"One Postgres epoch of {args.rows:,} rows, median of {len(kept['record'])} "
            "alternated rounds",
            [(labels[n], statistics.median(t)) for n, t in kept.items()],
            "ms per epoch (lower is better)",
            highlight=[labels["grouped"]],
            value_format="{:,.1f}",
        )
        print(f"chart: {written}")


if __name__ == "__main__":
    main()
