"""Every benchmark, one after another, each drawing its chart into docs/img: `make bench`.

    .venv/bin/python -m benchmarks.run_all [--quick] [--only NAME,...] [--img docs/img] [--list]

Brings up the test bed's servers the benchmarks use (`up`, never a restart), then runs each
benchmark as its own process, its output passed through, with a progress line before and after
it: which benchmark of how many, the command, the time it took and the time since the start.
A benchmark that fails does not stop the others; the summary at the end lists every one with
its time and result, and the exit status is non-zero if any failed.

`--quick` runs each with the modest sizes and rounds that docs/benchmarks.md's charts were
drawn from (2 shared cores: the ratios are measured within one process and stay meaningful,
absolute times do not; spark_end_to_end gets one round, its chart in the docs is from three);
without it, each benchmark's defaults (an estimated 15 minutes, 6-7 of them spark_end_to_end).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Step:
    """One benchmark run: its chart's name, its module, its arguments in full and quick."""

    name: str
    module: str
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()

    def command(self, img: Path, *, quick: bool) -> list[str]:
        arguments = self.quick if quick else self.full
        return ["-m", self.module, *arguments, "--chart", str(img / f"{self.name}.png")]


#: A Spark query into Kafka: ours (defaults, with the epoch header, uncompressed), Spark's
#: Kafka sink and the floor, in a chart of their own (docs/benchmarks.md, Kafka).
KAFKA_SPARK = "kafka-ours-eo,kafka-ours-eo-header,kafka-ours-eo-uncompressed,kafka-spark,floor"
#: A Spark query into Postgres: ours (grouped record batches and not), Spark's JDBC sink
#: (plain and with reWriteBatchedInserts) and the floor (docs/benchmarks.md, Postgres).
POSTGRES_SPARK = "pg-ours-eo,pg-ours-eo-ungrouped,pg-jdbc,pg-jdbc-rewrite,floor"

STEPS = (
    Step("protocol_overhead", "benchmarks.protocol_overhead"),
    Step("postgres_sink", "benchmarks.postgres_sink", quick=("--rounds", "5")),
    Step("kafka_sink", "benchmarks.kafka_sink"),
    Step("kafka_startup", "benchmarks.kafka_startup"),
    Step("kafka_bad_rows", "benchmarks.kafka_bad_rows", quick=("--pairs", "9")),
    Step("spark_end_to_end", "benchmarks.spark_end_to_end", quick=("--rounds", "1")),
    Step(
        "kafka_spark",
        "benchmarks.spark_end_to_end",
        ("--variants", KAFKA_SPARK),
        ("--variants", KAFKA_SPARK, "--rounds", "1"),
    ),
    Step(
        "postgres_spark",
        "benchmarks.spark_end_to_end",
        ("--variants", POSTGRES_SPARK),
        ("--variants", POSTGRES_SPARK, "--rounds", "1"),
    ),
    Step("record_batch_groups", "benchmarks.record_batch_groups"),
    Step("driver_memory", "benchmarks.driver_memory", quick=("--rounds", "1")),
    Step("cost_model", "benchmarks.cost_model", quick=("--parts", "1,8,32")),
    Step("executor_profile", "benchmarks.executor_profile", quick=("--batches", "5")),
    Step("driver_profile", "benchmarks.driver_profile", quick=("--batches", "5")),
    Step("driver_reads", "benchmarks.driver_reads", quick=("--rows", "300000")),
    Step(
        "files_sink",
        "benchmarks.s3_sink",
        ("--only", "files"),
        ("--only", "files", "--rounds", "3", "--profile", "0"),
    ),
    Step("s3_sink", "benchmarks.s3_sink", ("--only", "s3"), ("--only", "s3", "--profile", "0")),
    Step("delta_sink", "benchmarks.delta_spark", quick=("--rounds", "1", "--batches", "3")),
    Step("iceberg_sink", "benchmarks.iceberg_sink", quick=("--shapes", "10x100000/10000")),
    # Runs itself in the pyspark 4.1 interpreter of tests/services/iceberg_spark.py (Spark's
    # Iceberg runtime has no build for the main lane's Spark), the checkout's wheel installed.
    Step(
        "iceberg_spark", "benchmarks.iceberg_spark", quick=("--sizes", "100000", "--batches", "3")
    ),
)
#: The test bed's servers the benchmarks above use.
SERVERS = ["postgres", "kafka", "s3", "spark", "iceberg-spark"]


def clock(seconds: float) -> str:
    """`75` -> `1m15s`; `3725` -> `1h02m05s`; under a minute `42s`."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def progress(number: int, total: int, name: str, what: str, since_start: float) -> str:
    """One progress line: `[3/9] kafka_sink: <what> (12m05s since the start)`."""
    return f"[{number}/{total}] {name}: {what} ({clock(since_start)} since the start)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run_all",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="the modest sizes of the charts")
    parser.add_argument("--only", default="", help="comma-separated names (see --list)")
    parser.add_argument("--img", type=Path, default=Path("docs/img"), help="where the PNGs go")
    parser.add_argument("--list", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    chosen = [name for name in args.only.split(",") if name]
    unknown = set(chosen) - {step.name for step in STEPS}
    if unknown:
        parser.error(f"unknown {sorted(unknown)}; choose from {', '.join(s.name for s in STEPS)}")
    steps = [step for step in STEPS if not chosen or step.name in chosen]
    if args.list:
        for step in steps:
            print(" ".join(["python", *step.command(args.img, quick=args.quick)]))
        return 0

    from tests.services import up

    up(SERVERS)
    began = time.monotonic()
    results: list[tuple[str, float, int]] = []
    for number, step in enumerate(steps, 1):
        command = step.command(args.img, quick=args.quick)
        shown = " ".join(["python", *command])
        print(progress(number, len(steps), step.name, shown, time.monotonic() - began), flush=True)
        started = time.monotonic()
        code = subprocess.run([sys.executable, *command], check=False).returncode
        took = time.monotonic() - started
        results.append((step.name, took, code))
        outcome = "done" if code == 0 else f"FAILED (exit {code})"
        what = f"{outcome} in {clock(took)}"
        print(progress(number, len(steps), step.name, what, time.monotonic() - began), flush=True)
    print(f"\nbenchmarks: {len(steps)} in {clock(time.monotonic() - began)}")
    for name, took, code in results:
        print(f"  {name:18s} {clock(took):>9s}  {'ok' if code == 0 else f'FAILED (exit {code})'}")
    return 1 if any(code for _, _, code in results) else 0


if __name__ == "__main__":
    sys.exit(main())
