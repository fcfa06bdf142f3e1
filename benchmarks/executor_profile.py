"""Where an executor-mode micro-batch spends its time, against driver mode and two floors.

    .venv/bin/python -m benchmarks.executor_profile [--rows-per-batch 100000] [--batches 10]
        [--chart PNG]

Needs the test bed's Postgres and Spark. The same rows as benchmarks/spark_end_to_end.py
(bigint, text, float8, timestamp; two Parquet files, so two partitions and two tasks on
`local[2]`) are read as a static DataFrame and written as batches 0, 1, ... after one warm-up
batch; per batch, in an order that alternates, it times:
- driver floor: the batch streamed to the driver as Arrow and dropped (what driver mode reads
  with, `durable_sinks.spark._arrow.socket_batches`);
- executor floor: a `mapInArrow` whose tasks only read their partition's record batches and
  return one row: the least any writer running in Spark's Python workers pays (Spark hands
  each partition from the JVM to a Python worker, and one row back);
- ours, driver mode: `durable_sink("postgres", ...)`'s call;
- ours, executor mode: `durable_sink("postgres", ..., execution="executor")`'s call;
- ours, executor mode split: the same epoch driven through the executor-mode writer's own
  coordinator (`run_distributed_epoch`), with tasks that run `prepare_part` as the writer's do
  but time each sink call (open = connecting, begin_epoch, write_batch, pre_commit, close) and
  each wait for a record batch; on the driver, the Spark job, the gap from its start to the
  first task's function and from the last task's end to the job's end, and the protocol
  after the job (decision, COMMIT PREPARED of each part, roll-back of other attempts).
Tasks report their medians over both partitions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from psycopg import sql

from benchmarks.driver_profile import scratch_schema, source_frame
from durable_sinks.core import CommitHandle, SinkConnector
from durable_sinks.spark import durable_sink, sink
from durable_sinks.spark._arrow import socket_batches
from tests.services import up

#: Milliseconds per named part of one batch.
Parts = dict[str, float]
TIMED_CALLS = ("open", "begin_epoch", "write_batch", "pre_commit", "close")


def executor_floor(batches: Iterator[Any]) -> Iterator[Any]:
    """A task that only reads its partition: one row back, with when it ran."""
    import pyarrow as pa

    started = time.time()
    for _ in batches:
        pass
    ended = time.time()
    times = {
        "task: function started": started,
        "task: function ended": ended,
        "task: function": (ended - started) * 1e3,
    }
    yield pa.record_batch([pa.array([json.dumps(times)])], names=["times"])


def timed_prepare(
    job: str,
    generation: int,
    epoch: int,
    build: Callable[[], SinkConnector],
    briefs: Mapping[str, bytes] | None = None,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The task function of executor mode (spark/_executor.py), timing each sink call; the
    sinks' task briefs (`briefs`) handed over as the writer's tasks do."""

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        from durable_sinks.coordinator import prepare_part

        started = time.time()
        ms: dict[str, float] = {}

        def timed(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
            def timed_call(*args: Any, **kwargs: Any) -> Any:
                begun = time.perf_counter()
                try:
                    return call(*args, **kwargs)
                finally:
                    ms[name] = ms.get(name, 0.0) + (time.perf_counter() - begun) * 1e3

            return timed_call

        def build_timed() -> list[SinkConnector]:
            built = build()
            for name in TIMED_CALLS:
                setattr(built, name, timed(f"task: {name}", getattr(built, name)))
            return [built]

        def waited(source: Iterator[Any]) -> Iterator[Any]:
            while True:
                begun = time.perf_counter()
                batch = next(source, None)
                ms["task: waiting for record batches"] = (
                    ms.get("task: waiting for record batches", 0.0)
                    + (time.perf_counter() - begun) * 1e3
                )
                if batch is None:
                    return
                yield batch

        context = TaskContext.get()
        part = f"p{context.partitionId()}-t{context.taskAttemptId()}" if context else "p0-t0"
        handles = prepare_part(
            job, generation, epoch, part, build_timed, waited(iter(batches)), briefs=briefs
        )
        ended = time.time()
        ms["task: function"] = (ended - started) * 1e3
        times = {**ms, "task: function started": started, "task: function ended": ended}
        handle = handles[0].dumps() if handles else None
        yield pa.record_batch(
            [pa.array([json.dumps(times)]), pa.array([handle], pa.string())],
            names=["times", "handle"],
        )

    return task


def timed_epoch(
    coordinator: Any,
    epoch: int,
    df: Any,
    build: Callable[[], SinkConnector],
    briefs: Callable[[int], Mapping[str, bytes]] | None = None,
) -> Parts:
    """One executor-mode epoch of `coordinator` (a started Coordinator) over `df`, its tasks
    timed (`timed_prepare`) and handed `briefs(epoch)` as the writer's are: the Spark job's
    parts, the wall time, and the protocol after the job."""
    measured: Parts = {}

    def prepare(generation: int) -> list[CommitHandle]:
        given = briefs(epoch) if briefs is not None else None
        task = timed_prepare(coordinator.job_id, generation, epoch, build, given)
        started = time.time()
        rows = df.mapInArrow(task, "times string, handle string").collect()
        measured.update(job_parts(started, time.time(), [json.loads(r[0]) for r in rows]))
        return [CommitHandle.from_json(json.loads(r[1])) for r in rows if r[1]]

    began = time.perf_counter()
    coordinator.run_distributed_epoch(epoch, prepare)
    measured["wall"] = (time.perf_counter() - began) * 1e3
    measured["protocol after the job"] = measured["wall"] - measured["spark job"]
    return measured


def job_parts(started: float, ended: float, tasks: list[dict[str, float]]) -> Parts:
    """The Spark job's wall time and its gaps around the tasks' functions, plus the tasks'
    own parts (median over tasks)."""
    first = min(t["task: function started"] for t in tasks)
    last = max(t["task: function ended"] for t in tasks)
    parts = {
        "spark job": (ended - started) * 1e3,
        "job start -> first task function": (first - started) * 1e3,
        "last task function -> job end": (ended - last) * 1e3,
    }
    names = {k for t in tasks for k in t} - {"task: function started", "task: function ended"}
    for name in names:
        parts[name] = statistics.median(t.get(name, 0.0) for t in tasks)
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows-per-batch", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--chart", type=Path, help="also draw the wall per batch into this PNG")
    args = parser.parse_args()
    testbed = up(["postgres", "spark"])
    spark = testbed.spark.session("executor-profile")
    work = Path(tempfile.mkdtemp(prefix="ds-executor-profile-"))
    df = source_frame(spark, work, args.rows_per_batch)
    pg = testbed.postgres.endpoint()
    admin, schema = scratch_schema(pg.conninfo())

    def writer(table: str, execution: Literal["driver", "executor"]) -> Any:
        spec = sink("postgres", dsn=pg.conninfo(), table=f"{schema}.{table}", create_table=True)
        job = f"profile-{execution}-{uuid.uuid4().hex[:6]}"
        # The batches come from a static DataFrame, not a streaming query: executor mode
        # must be told which query it serves (rows it never sees cannot prove a replay), so
        # each job gets a checkpoint of its own, whose metadata names a query of its own.
        checkpoint = work / f"checkpoint-{job}"
        checkpoint.mkdir()
        (checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
        made = durable_sink(
            [spec], job_id=job, execution=execution, checkpoint_location=str(checkpoint)
        )
        return made, spec

    driver, _ = writer("driver", "driver")
    executor, _ = writer("executor", "executor")
    # The split drives its own executor-mode job's coordinator, started by one call.
    split_job, spec = writer("split", "executor")
    split_job(df, 0)
    coordinator = split_job._coordinator  # what the writer's calls drive
    assert coordinator is not None

    def split(epoch: int) -> Parts:
        return timed_epoch(coordinator, epoch, df, spec.build)

    def floor_of_executors(_: int) -> Parts:
        started = time.time()
        rows = df.mapInArrow(executor_floor, "times string").collect()
        return job_parts(started, time.time(), [json.loads(r[0]) for r in rows])

    def floor_of_driver(epoch: int) -> Parts:
        for _ in socket_batches(df, job="floor", epoch=epoch):
            pass
        return {}

    def called(job: Any) -> Callable[[int], Parts]:
        def run(epoch: int) -> Parts:
            job(df, epoch)
            return {}

        return run

    variants: dict[str, Callable[[int], Parts]] = {
        "driver floor": floor_of_driver,
        "executor floor": floor_of_executors,
        "ours, driver mode": called(driver),
        "ours, executor mode": called(executor),
        "ours, executor mode split": lambda epoch: split(epoch + 1),
    }
    rows: dict[str, list[Parts]] = {name: [] for name in variants}
    for batch in range(args.batches + 1):
        order = list(variants) if batch % 2 else list(reversed(variants))
        for name in order:
            admin.execute("CHECKPOINT")
            time.sleep(0.3)
            began = time.perf_counter()
            parts = variants[name](batch)
            parts.setdefault("wall", (time.perf_counter() - began) * 1e3)
            if batch > 0:
                rows[name].append(parts)
    for job in (driver, executor, split_job):
        job.close()
    admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    report(rows, args)


def report(rows: dict[str, list[Parts]], args: argparse.Namespace) -> None:
    print(f"\n{args.batches} batches of {args.rows_per_batch:,} rows; medians in ms\n")
    print("| variant | wall per batch |")
    print("|---|---|")
    wall = {name: statistics.median(r["wall"] for r in runs) for name, runs in rows.items()}
    for name, ms in wall.items():
        print(f"| {name} | {ms:.1f} |")
    print("\n| part | executor floor | ours, executor mode split |")
    print("|---|---|---|")
    floor, ours = rows["executor floor"], rows["ours, executor mode split"]
    for name in sorted({k for r in ours for k in r} | {k for r in floor for k in r}):
        cells = [
            f"{statistics.median(r[name] for r in runs):.1f}" if name in runs[0] else "-"
            for runs in (floor, ours)
        ]
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    ratios = (
        f"executor mode / driver mode (throughput): "
        f"{wall['ours, driver mode'] / wall['ours, executor mode']:.2f}x; "
        f"executor floor / driver floor (time): "
        f"{wall['executor floor'] / wall['driver floor']:.2f}x; "
        f"executor floor / ours, driver mode (time): "
        f"{wall['executor floor'] / wall['ours, driver mode']:.2f}x"
    )
    print(f"\n{ratios}")
    if args.chart is not None:
        from benchmarks.charts import bar_chart

        written = bar_chart(
            args.chart,
            f"Executor vs driver mode: {args.rows_per_batch:,} rows per batch, local[2], "
            f"median of {args.batches} batches\n"
            + ratios.replace("; executor floor / ours", ";\nexecutor floor / ours"),
            list(wall.items()),
            "ms per batch (lower is better)",
            highlight=[name for name in wall if name.startswith("ours")],
            references=[("driver floor", wall["driver floor"])],
        )
        print(f"chart: {written}")


if __name__ == "__main__":
    main()
