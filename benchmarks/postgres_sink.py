"""The Postgres sink in exactly-once mode vs raw `psql \\copy ... (FORMAT binary)` of the same rows.

    .venv/bin/python -m benchmarks.postgres_sink [--rows 1000000] [--epoch-rows 100000]
        [--rounds 3] [--small-epochs 300] [--chart PNG]

Needs the test bed's Postgres (`python -m tests.services up postgres`). The same rows
(bigint, text, float8, timestamptz) are encoded once to a binary COPY file for psql; our sink
gets them as Arrow record batches, `--epoch-rows` per epoch, through the coordinator with the
local-directory decision store (fsync on), in both exactly-once modes:
- one-phase (the default when Postgres is the job's only sink): COPY, then one COMMIT that
  carries the epoch's decision in the marker row;
- two-phase (what every multi-sink job does; `one_phase=False`): COPY, PREPARE TRANSACTION,
  decision record in the store, COMMIT PREPARED.
Raw and ours alternate (raw, one-phase, two-phase, raw, ...) into fresh tables and the best of
each is kept, so drift in the machine hits all three. Then: the per-epoch commit overhead of
each mode over many small epochs, and the upsert mode's rate.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pgpq
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from durable_sinks.coordinator import Coordinator
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.services import Testbed

UTC = timezone.utc

SCHEMA = "bench"
TABLE_DDL = "(id bigint, body text, score double precision, at timestamptz)"


def make_rows(count: int) -> pa.Table:
    rng = random.Random(7)
    start = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1e6)
    ids = pa.array(range(count), pa.int64())
    return pa.table(
        {
            "id": ids,
            "body": pa.array([f"event body {i % 1000:04d} lorem ipsum" for i in range(count)]),
            "score": pa.array([rng.random() for _ in range(count)], pa.float64()),
            "at": pc.add(pc.multiply(ids, 1000), start).cast(pa.timestamp("us", tz="UTC")),
        }
    )


def copy_file(table: pa.Table, path: Path) -> None:
    encoder = pgpq.ArrowToPostgresBinaryEncoder(table.schema)
    with path.open("wb") as out:
        out.write(encoder.write_header())
        for batch in table.to_batches(max_chunksize=100_000):
            out.write(encoder.write_batch(batch))
        out.write(encoder.finish())


def reset_table(conn: psycopg.Connection[tuple[Any, ...]], name: str, *, key: bool = False) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{name}")
    ddl = TABLE_DDL.replace("id bigint", "id bigint PRIMARY KEY") if key else TABLE_DDL
    conn.execute(f"CREATE TABLE {SCHEMA}.{name} {ddl}")
    conn.execute("CHECKPOINT")


def raw_copy(dsn: str, name: str, path: Path) -> float:
    params = conninfo_to_dict(dsn)
    env = {**os.environ, "PGPASSWORD": str(params.pop("password", ""))}
    started = time.perf_counter()
    subprocess.run(
        [
            "psql",
            make_conninfo(**{k: str(v) for k, v in params.items()}),
            "-v",
            "ON_ERROR_STOP=1",
            "-qc",
            f"\\copy {SCHEMA}.{name} FROM '{path}' (FORMAT binary)",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


def ours(
    dsn: str,
    name: str,
    table: pa.Table,
    epoch_rows: int,
    store: Path,
    mode: str = "append",
    *,
    one_phase: bool = True,
) -> tuple[float, list[float], dict[str, float]]:
    shutil.rmtree(store, ignore_errors=True)
    options = {"mode": "upsert", "key": ("id",)} if mode == "upsert" else {}
    sink = PostgresSink(Postgres(dsn, f"{SCHEMA}.{name}", **options))  # type: ignore[arg-type]
    coordinator = Coordinator(
        f"bench-{name}-{uuid.uuid4().hex[:8]}",
        [sink],
        LocalDirectoryStore(store),
        one_phase=one_phase,
    )
    coordinator.start()
    protocol = []
    phases: dict[str, float] = {}
    started = time.perf_counter()
    for epoch, offset in enumerate(range(0, table.num_rows, epoch_rows)):
        chunk = table.slice(offset, epoch_rows)
        result = coordinator.run_epoch(epoch, chunk.to_batches(max_chunksize=epoch_rows))
        protocol.append(result.metrics.protocol_seconds)
        for phase, seconds in result.metrics.seconds.items():
            phases[phase] = phases.get(phase, 0.0) + seconds
    elapsed = time.perf_counter() - started
    coordinator.close()
    return elapsed, protocol, phases


def count(conn: psycopg.Connection[tuple[Any, ...]], name: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {SCHEMA}.{name}").fetchone()
    return int(row[0]) if row else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--epoch-rows", type=int, default=100_000)
    parser.add_argument("--small-epochs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chart", type=Path, help="also draw the ratios to raw into this PNG")
    args = parser.parse_args()
    dsn = Testbed.create().postgres.endpoint().conninfo()
    work = Path(tempfile.mkdtemp(prefix="ds-pg-bench-"))
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    rows = make_rows(args.rows)
    copy_file(rows, work / "rows.bin")
    size = (work / "rows.bin").stat().st_size

    raw_times: list[float] = []
    times: dict[str, list[float]] = {"one-phase": [], "two-phase": []}
    phases: dict[str, list[dict[str, float]]] = {"one-phase": [], "two-phase": []}
    for round_ in range(args.rounds):
        reset_table(conn, "raw")
        raw_times.append(raw_copy(dsn, "raw", work / "rows.bin"))
        assert count(conn, "raw") == args.rows
        for mode in times:
            reset_table(conn, "ours")
            elapsed, _, spent = ours(
                dsn,
                "ours",
                rows,
                args.epoch_rows,
                work / f"store-{mode}-{round_}",
                one_phase=mode == "one-phase",
            )
            times[mode].append(elapsed)
            phases[mode].append(spent)
            assert count(conn, "ours") == args.rows
    raw_best = min(raw_times)

    overhead: dict[str, list[float]] = {}
    small = make_rows(args.small_epochs * 1000)
    for mode in times:
        reset_table(conn, "small")
        _, protocol, _ = ours(
            dsn, "small", small, 1000, work / f"store-small-{mode}", one_phase=mode == "one-phase"
        )
        overhead[mode] = sorted(protocol)

    reset_table(conn, "upsert", key=True)
    conn.execute(f"INSERT INTO {SCHEMA}.upsert SELECT * FROM {SCHEMA}.raw WHERE id % 2 = 0")
    upsert_time, _, _ = ours(dsn, "upsert", rows, args.epoch_rows, work / "store-upsert", "upsert")
    assert count(conn, "upsert") == args.rows

    epochs = -(-args.rows // args.epoch_rows)
    print(
        f"{args.rows:,} rows (bigint, text, float8, timestamptz), {size / 1e6:.0f} MB as "
        f"binary COPY; epochs of {args.epoch_rows:,}; best of {args.rounds} rounds"
    )
    print(
        f"raw psql \\copy binary:     best {raw_best:.2f} s  ({args.rows / raw_best:,.0f} rows/s)"
        f"  runs {', '.join(f'{t:.2f}' for t in raw_times)}"
    )
    for mode, runs in times.items():
        best = min(runs)
        spent = phases[mode][runs.index(best)]
        fixed = sum(v for k, v in spent.items() if k != "write")
        print(
            f"ours, exactly-once {mode}: best {best:.2f} s  ({args.rows / best:,.0f} rows/s)"
            f"  runs {', '.join(f'{t:.2f}' for t in runs)}  ->  {raw_best / best:.2f}x raw "
            f"(medians: {statistics.median(raw_times) / statistics.median(runs):.2f}x)"
        )
        print(
            f"    COPY (write phase) {spent['write']:.2f} s; per-epoch fixed cost "
            f"{fixed / epochs * 1e3:.1f} ms x {epochs} epochs ("
            + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in spent.items() if k != "write")
            + " ms)"
        )
    for mode, protocol in overhead.items():
        print(
            f"commit overhead per epoch, {mode} ({args.small_epochs} epochs of 1,000 rows; "
            f"protocol time outside COPY): p50 {statistics.median(protocol) * 1e3:.1f} ms, "
            f"p99 {protocol[int(0.99 * (len(protocol) - 1))] * 1e3:.1f} ms"
        )
    print(
        f"upsert (half the keys exist): {upsert_time:.2f} s ({args.rows / upsert_time:,.0f} rows/s)"
    )
    if args.chart is not None:
        chart(args, raw_times, times)
    for name in ("raw", "ours", "small", "upsert"):
        conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{name}")
    shutil.rmtree(work, ignore_errors=True)


def chart(args: argparse.Namespace, raw: list[float], times: dict[str, list[float]]) -> None:
    """Each mode's throughput as a multiple of raw psql's: best to best, median to median."""
    from benchmarks.charts import RATIO, grouped_bar_chart

    labels = {
        "one-phase": "ours, one-phase (Postgres alone, default)",
        "two-phase": "ours, two-phase (any multi-sink job)",
    }
    written = grouped_bar_chart(
        args.chart,
        f"Postgres sink vs psql \\copy binary: {args.rows:,} rows, epochs of "
        f"{args.epoch_rows:,}, {args.rounds} rounds\nthroughput / raw's (higher is better)",
        [labels[mode] for mode in times],
        [
            ("best / best", [min(raw) / min(runs) for runs in times.values()]),
            (
                "median / median",
                [statistics.median(raw) / statistics.median(runs) for runs in times.values()],
            ),
        ],
        "x raw psql \\copy (FORMAT binary) of the same rows",
        references=[("raw = 1x", 1.0), ("goal 0.95x", 0.95)],
        value_format=RATIO,
    )
    print(f"chart: {written}")


if __name__ == "__main__":
    main()
