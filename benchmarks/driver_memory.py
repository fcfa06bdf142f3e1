"""How much memory a driver-mode batch takes in the driver, against the batch's Arrow size.

    .venv/bin/python -m benchmarks.driver_memory [--rows 1000000] [--rounds 3]

Needs the test bed's Postgres and Spark. One micro-batch of benchmarks/spark_end_to_end.py's
rows (bigint, text, float8, timestamp; two Parquet files, so two partitions on `local[2]`) is
read as a static DataFrame and handed, as Spark's foreachBatch would, to:
- ours: a `durable_sink("postgres", ...)` writer, exactly-once, driver mode's streamed read;
- floor: the same streamed read (`socket_batches`), each record batch dropped on arrival;
- peer: `df.toArrow()`, what a user writing the batch from the driver would call instead (the
  whole batch in memory at once), then dropped.
Before each run freed memory is handed back to the system (`malloc_trim`; Arrow allocates
through the system allocator here, `ARROW_DEFAULT_MEMORY_POOL=system`, set before pyarrow
loads) and the kernel's peak-RSS counters of the driver's Python and of the driver's JVM are
reset (`/proc/PID/clear_refs`); after it, each process's peak (`VmHWM`) minus its RSS before
the run is its peak growth over the batch. The Arrow size is the sum of `RecordBatch.nbytes`
of the batch's record batches (counted by the floor as they pass). Runs alternate over the
rounds (forward, backward, ...) after one warm-up of each; every run of ours is checked (the
table holds the rows of every batch written so far, no prepared transaction is left).
"""

from __future__ import annotations

import os

os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

import argparse
import ctypes
import statistics
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from psycopg import sql

from benchmarks.driver_profile import pids_of, scratch_schema, source_frame
from durable_sinks.spark import durable_sink
from durable_sinks.spark._arrow import socket_batches
from tests.services import up

MIB = 2**20


def status_kib(pid: int | str, field: str) -> int:
    """A `kB` field of /proc/PID/status."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def reset_peak(pid: int | str) -> None:
    """Set the process's VmHWM back to its current RSS."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as refs:
        refs.write("5")


def _mine(pid: int) -> bool:
    """Whether `pid` descends from this process (the JVM this process's PySpark started)."""
    while pid > 1:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        if pid == os.getpid():
            return True
    return False


def trim() -> None:
    """Hand the C allocator's freed memory back to the system (glibc)."""
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def measured(run: Callable[[], None], pids: dict[str, int | str]) -> dict[str, float]:
    """Run `run`; each process's peak RSS growth over it, in MiB."""
    trim()
    before = {name: status_kib(pid, "VmRSS") for name, pid in pids.items()}
    for pid in pids.values():
        reset_peak(pid)
    run()
    return {name: (status_kib(pid, "VmHWM") - before[name]) / 1024 for name, pid in pids.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chart", type=Path, help="also draw the peak growths into this PNG")
    args = parser.parse_args()
    import pyarrow as pa

    if pa.default_memory_pool().backend_name != "system":
        raise RuntimeError("Arrow must allocate through the system allocator here")
    testbed = up(["postgres", "spark"])
    spark = testbed.spark.session("memory")
    work = Path(tempfile.mkdtemp(prefix="ds-memory-"))
    df = source_frame(spark, work, args.rows)
    pg = testbed.postgres.endpoint()
    admin, schema = scratch_schema(pg.conninfo())
    table = sql.Identifier(schema, "t")
    job = f"memory-{uuid.uuid4().hex[:8]}"
    writer = durable_sink(
        "postgres", dsn=pg.conninfo(), table=f"{schema}.t", create_table=True, job_id=job
    )
    jvm = [p for p in pids_of(lambda c: "java" in c and "pyspark-shell" in c) if _mine(p)]
    if len(jvm) != 1:
        raise RuntimeError(f"expected one driver JVM, found {jvm}")
    pids: dict[str, int | str] = {"python": "self", "jvm": jvm[0]}
    arrow_bytes: list[int] = []
    epochs = [0]

    def floor() -> None:
        nbytes = 0
        for batch in socket_batches(df, job="floor"):
            nbytes += batch.nbytes
        arrow_bytes.append(nbytes)

    def ours() -> None:
        writer(df, epochs[0])
        epochs[0] += 1
        found = admin.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
        if found is None or found[0] != args.rows * epochs[0]:
            raise RuntimeError(f"{found} rows after {epochs[0]} batches of {args.rows}")
        held = admin.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%{job}%",)
        ).fetchone()
        if held is None or held[0] != 0:
            raise RuntimeError(f"{held} prepared transactions left behind")

    def peer() -> None:
        table_ = df.toArrow()
        if table_.num_rows != args.rows:
            raise RuntimeError(f"toArrow gave {table_.num_rows} rows")
        del table_

    variants: dict[str, Callable[[], None]] = {"floor": floor, "ours": ours, "peer": peer}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for run in variants.values():  # warm-up: class loading, JIT, connections
        measured(run, pids)
    for round_ in range(args.rounds):
        order = list(variants) if round_ % 2 == 0 else list(variants)[::-1]
        for name in order:
            results[name].append(measured(variants[name], pids))
    writer.close()
    admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    report(results, arrow_bytes[-1], args)
    if args.chart is not None:
        from benchmarks.charts import bar_chart

        arrow = arrow_bytes[-1] / MIB
        written = bar_chart(
            args.chart,
            f"Driver's Python: peak RSS growth over one batch of {args.rows:,} rows\n"
            f"(Arrow size {arrow:.1f} MiB), median of {args.rounds} rounds",
            [
                (LABELS[n], statistics.median(r["python"] for r in runs))
                for n, runs in results.items()
            ],
            "MiB (lower is better)",
            highlight=[LABELS["ours"]],
            references=[("Arrow size", arrow), ("2x Arrow size", 2 * arrow)],
            value_format="{:,.1f}",
        )
        print(f"chart: {written}")


LABELS = {
    "floor": "floor: streamed read, record batches dropped",
    "ours": "ours: Postgres exactly-once, driver mode",
    "peer": "peer: df.toArrow()",
}


def report(
    results: dict[str, list[dict[str, float]]], arrow: int, args: argparse.Namespace
) -> None:
    print(
        f"\none batch of {args.rows:,} rows, Arrow size {arrow / MIB:.1f} MiB "
        f"(sum of RecordBatch.nbytes); peak RSS growth over the batch, MiB, median of "
        f"{args.rounds} rounds (runs)"
    )
    print("\n| variant | driver Python | x Arrow size | driver JVM | runs (Python) |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        python = statistics.median(r["python"] for r in runs)
        jvm = statistics.median(r["jvm"] for r in runs)
        print(
            f"| {LABELS[name]} | {python:.1f} | {python * MIB / arrow:.2f}x | {jvm:.1f} | "
            + ", ".join(f"{r['python']:.1f}" for r in runs)
            + " |"
        )


if __name__ == "__main__":
    main()
