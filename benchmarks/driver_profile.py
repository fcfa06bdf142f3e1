"""Where a driver-mode micro-batch spends its time: Spark's read, our sinks, the protocol, CPU.

    .venv/bin/python -m benchmarks.driver_profile [--rows-per-batch 100000] [--batches 10]
        [--sinks postgres|kafka|postgres,kafka] [--cprofile FILE] [--chart PNG]

Needs the test bed's Postgres and Spark (and Kafka for `--sinks kafka`). The same rows as
benchmarks/spark_end_to_end.py (bigint, text, float8, timestamp; two Parquet files per batch,
so two partitions on `local[2]`) are read as a static DataFrame and handed to a
`durable_sink(...)` writer as batches 0, 1, ... (the foreachBatch call Spark would make), after
one warm-up batch. For each batch it records:
- the timeline of the driver's Python: when Spark's job started, when each Arrow record batch
  arrived (the time the driver waited for it), how long each sink's `write_batch` took and,
  for Postgres, its parts (schema checks, pgpq encoding, sending, the COPY's end);
- the coordinator's phases (begin, write, pre_commit, decision, commit);
- Spark's own view of the job (its tasks' run, CPU, deserialisation and result serialisation
  times, from the status REST API of the driver's web UI, enabled for this script);
- CPU seconds spent meanwhile by the driver's JVM (local[2]: it runs the executors too), the
  driver's Python, and every process of the test bed's Postgres / Kafka broker: with 2 cores,
  (sum of CPU) / 2 is the least wall time any schedule of the same work can take.
The floor (the same streamed read, record batches dropped) runs in the same script, batch for
batch alternating with ours. With `--cprofile FILE` the writer's calls also run under cProfile
(slower) and its statistics are written to FILE.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import statistics
import tempfile
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.spark_end_to_end import FILES_PER_BATCH, write_source
from durable_sinks.spark import durable_sink, sink
from durable_sinks.spark._arrow import socket_batches
from tests.services import up

#: Milliseconds per named part of one batch, appended to as the batch runs.
Parts = dict[str, float]


class Clock:
    """Accumulates time per part name while `active`."""

    def __init__(self) -> None:
        self.parts: Parts = defaultdict(float)
        self.active = False

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.active:
                self.parts[name] += (time.perf_counter() - started) * 1e3


def instrument(clock: Clock) -> None:
    """Wrap the functions whose time the profile splits out (this process only)."""
    import pgpq
    from psycopg import Copy

    from durable_sinks.sinks.kafka.sink import KafkaSink
    from durable_sinks.sinks.postgres import catalog
    from durable_sinks.sinks.postgres import sink as pg_sink
    from durable_sinks.sinks.postgres import writer as load
    from durable_sinks.spark import _writer

    def wrap(owner: Any, name: str, part: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with clock.part(part):
                return original(*args, **kwargs)

        setattr(owner, name, timed)

    wrap(pg_sink.PostgresSink, "write_batch", "postgres: write_batch")
    wrap(KafkaSink, "write_batch", "kafka: write_batch")
    wrap(Copy, "write", "postgres: send (Copy.write)")
    wrap(Copy, "__exit__", "postgres: COPY end (server finishes)")
    wrap(pg_sink, "bad_values", "postgres: bad-value checks")
    wrap(catalog.TargetTable, "columns_for", "postgres: schema check")

    real_encoder = pgpq.ArrowToPostgresBinaryEncoder

    class TimedEncoder:
        def __init__(self, schema: Any) -> None:
            self.inner = real_encoder(schema)

        def write_header(self) -> bytes:
            return bytes(self.inner.write_header())

        def write_batch(self, batch: Any) -> bytes:
            with clock.part("postgres: pgpq encode"):
                return bytes(self.inner.write_batch(batch))

        def finish(self) -> bytes:
            return bytes(self.inner.finish())

    timed_pgpq = type("pgpq", (), {"ArrowToPostgresBinaryEncoder": TimedEncoder})
    setattr(load, "pgpq", timed_pgpq)  # noqa: B010 - not an attribute mypy knows of

    real_stream = getattr(_writer, "socket_batches")  # noqa: B009

    def timed_stream(df: Any, **kwargs: Any) -> Iterator[Any]:
        return waited(real_stream(df, **kwargs), clock)

    setattr(_writer, "socket_batches", timed_stream)  # noqa: B010


def waited(batches: Iterator[Any], clock: Clock) -> Iterator[Any]:
    """`batches`, timing each wait for the next one (the first: Spark's job until its first
    record batch)."""
    first = True
    while True:
        started = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            if clock.active:
                clock.parts["spark: after the last record batch"] += (
                    time.perf_counter() - started
                ) * 1e3
            return
        if clock.active:
            name = "spark: until the first record batch" if first else "spark: waiting for more"
            clock.parts[name] += (time.perf_counter() - started) * 1e3
            clock.parts["record batches"] += 1
        first = False
        yield batch


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds the threads of `pids` have run so far (the scheduler's nanosecond counts;
    threads and processes that ended count 0, except in this process, whose ended threads,
    e.g. the epoch's writer threads, count in full)."""
    if pids == [os.getpid()]:
        return time.process_time()
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9


def pids_of(match: Callable[[str], bool]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if match(cmdline):
            found.append(int(entry.name))
    return found


def with_descendants(roots: list[int]) -> list[int]:
    """`roots` and every process below them (other checkouts' Spark drivers and test beds on
    the same machine are not counted)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # "pid (comm) state ppid ...": the command may hold spaces, not ")".
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children[parent].append(int(entry.name))
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


class SparkRest:
    """The driver web UI's status API: the stages of the jobs a batch ran."""

    def __init__(self, spark: Any) -> None:
        self.url = spark.sparkContext.uiWebUrl.rstrip("/")
        self.app = spark.sparkContext.applicationId

    def get(self, path: str) -> Any:
        url = f"{self.url}/api/v1/applications/{self.app}/{path}"  # the driver's own http UI
        with urllib.request.urlopen(url) as r:  # noqa: S310
            return json.load(r)

    def stage_ids(self) -> set[int]:
        return {s["stageId"] for s in self.get("stages")}

    def task_parts(self, stage_ids: set[int]) -> Parts:
        """Summed over the tasks of `stage_ids` (ms): run, CPU, deserialise, serialise result,
        GC; and the stages' wall time (submission to completion)."""
        parts: Parts = defaultdict(float)
        for stage_id in stage_ids:
            for attempt in self.get(f"stages/{stage_id}"):
                tasks = self.get(f"stages/{stage_id}/{attempt['attemptId']}/taskList?length=1000")
                for task in tasks:
                    m = task.get("taskMetrics", {})
                    parts["tasks: run"] += m.get("executorRunTime", 0)
                    parts["tasks: CPU"] += m.get("executorCpuTime", 0) / 1e6
                    parts["tasks: deserialise"] += m.get("executorDeserializeTime", 0)
                    parts["tasks: serialise result"] += m.get("resultSerializationTime", 0)
                    parts["tasks: GC"] += m.get("jvmGcTime", 0)
                    parts["tasks"] += 1
        return parts


def source_frame(spark: Any, work: Path, rows_per_batch: int) -> Any:
    """One batch of benchmarks/spark_end_to_end.py's rows, as a static DataFrame of
    FILES_PER_BATCH Parquet files (a partition each) written under `work`."""
    spark.sparkContext.setLogLevel("ERROR")
    write_source(work / "in", rows_per_batch, 1)
    df = spark.read.parquet(str(work / "in"))
    if df.rdd.getNumPartitions() != FILES_PER_BATCH:
        raise RuntimeError(f"expected {FILES_PER_BATCH} partitions")
    return df


def scratch_schema(conninfo: str) -> tuple[psycopg.Connection[Any], str]:
    """An autocommit connection and a fresh schema for the profile's tables (dropped by the
    caller)."""
    schema = f"profile_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(conninfo, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    return admin, schema


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows-per-batch", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--sinks", default="postgres", help="postgres, kafka or postgres,kafka")
    parser.add_argument("--cprofile", type=Path, help="also run ours under cProfile, stats here")
    parser.add_argument("--chart", type=Path, help="also draw floor vs ours into this PNG")
    args = parser.parse_args()
    kinds = [k for k in args.sinks.split(",") if k]
    servers = ["postgres", "spark"] + (["kafka"] if "kafka" in kinds else [])
    testbed = up(servers)
    spark = testbed.spark.session(
        "profile",
        **{"spark.ui.enabled": "true", "spark.ui.port": "4099", "spark.ui.host": "127.0.0.1"},
    )
    rest = SparkRest(spark)
    work = Path(tempfile.mkdtemp(prefix="ds-profile-"))
    df = source_frame(spark, work, args.rows_per_batch)
    pg = testbed.postgres.endpoint()
    admin, schema = scratch_schema(pg.conninfo())
    specs = []
    if "postgres" in kinds:
        specs.append(sink("postgres", dsn=pg.conninfo(), table=f"{schema}.t", create_table=True))
    if "kafka" in kinds:
        from confluent_kafka.admin import AdminClient

        from tests.support.targets import create_topic

        kafka = testbed.kafka.endpoint()
        topic = f"profile-{uuid.uuid4().hex[:8]}"
        create_topic(AdminClient(kafka.config()), topic, partitions=2)
        specs.append(sink("kafka", bootstrap_servers=kafka.bootstrap_servers, topic=topic))
    options: dict[str, Any] = {"job_id": f"profile-{uuid.uuid4().hex[:8]}"}
    if "postgres" not in kinds:
        options["decision_store"] = str(work / "decisions")
    writer = durable_sink(specs, **options)

    clock = Clock()
    instrument(clock)
    # This driver's own JVM, and the test bed's servers (by their folders), not others'.
    beds = os.environ.get("DS_SERVICES_DIR") or str(Path(__file__).parents[1] / ".services")
    jvm = [p for p in with_descendants([os.getpid()]) if p != os.getpid()]
    pg_pids = with_descendants(pids_of(lambda c: f"-D {beds}/postgres/" in c))
    kafka_pids = pids_of(lambda c: "kafka.Kafka" in c and f"={beds}/kafka/" in c)
    me = [os.getpid()]
    processes = {
        "cpu: Spark JVM": jvm,
        "cpu: driver Python": me,
        "cpu: Postgres": pg_pids,
        "cpu: Kafka broker": kafka_pids,
    }
    if "kafka" not in kinds:  # (a broker then serves other work, not this profile's)
        del processes["cpu: Kafka broker"]
    profiler = cProfile.Profile() if args.cprofile else None

    def floor(epoch: int) -> None:
        for _ in waited(socket_batches(df, job="floor", epoch=epoch), clock):
            pass

    def ours(epoch: int) -> None:
        if profiler is not None:
            profiler.enable()
        try:
            writer(df, epoch)
        finally:
            if profiler is not None:
                profiler.disable()

    rows: dict[str, list[Parts]] = {"floor": [], "ours": []}
    epoch = 0
    for batch in range(args.batches + 1):
        for name, run in (
            (("floor", floor), ("ours", ours))
            if batch % 2
            else (
                ("ours", ours),
                ("floor", floor),
            )
        ):
            admin.execute("CHECKPOINT")
            time.sleep(0.3)
            before_stages = rest.stage_ids()
            cpu = {key: cpu_seconds(pids) for key, pids in processes.items()}
            clock.parts = defaultdict(float)
            clock.active = batch > 0
            started = time.perf_counter()
            if name == "ours":
                run(epoch)
                epoch += 1
            else:
                run(-1)
            wall = (time.perf_counter() - started) * 1e3
            clock.active = False
            if batch == 0:
                continue
            parts = dict(clock.parts)
            parts["wall"] = wall
            for key, pids in processes.items():
                parts[key] = (cpu_seconds(pids) - cpu[key]) * 1e3
            parts["cpu: all / 2 cores"] = sum(parts[k] for k in cpu) / 2
            parts.update(rest.task_parts(rest.stage_ids() - before_stages))
            if name == "ours":
                result = writer.last_result
                assert result is not None
                for phase, seconds in result.metrics.seconds.items():
                    parts[f"phase: {phase}"] = seconds * 1e3
            rows[name].append(parts)
    writer.close()
    admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    report(rows, args)
    if profiler is not None:
        profiler.dump_stats(str(args.cprofile))
        print(f"cProfile statistics: {args.cprofile}")


#: Parts that are counts, not milliseconds.
COUNTS = ("record batches", "tasks")


def medians(rows: dict[str, list[Parts]]) -> dict[str, dict[str, float | None]]:
    """Per part (wall first, then by name), the median of each variant; None where the
    variant never had that part."""
    names = sorted({k for parts in rows.values() for run in parts for k in run} - {"wall"})
    table: dict[str, dict[str, float | None]] = {}
    for name in ["wall", *names]:
        table[name] = {}
        for variant, runs in rows.items():
            values = [run.get(name, 0.0) for run in runs]
            table[name][variant] = statistics.median(values) if any(values) else None
    return table


def report(rows: dict[str, list[Parts]], args: argparse.Namespace) -> None:
    print(
        f"\n{args.batches} batches of {args.rows_per_batch:,} rows, sinks {args.sinks}; "
        f"medians in ms (counts for {' and '.join(repr(c) for c in COUNTS)})\n"
    )
    print("| part | floor | ours |")
    print("|---|---|---|")
    table = medians(rows)
    for name, cells in table.items():
        shown = [f"{cells[v]:.1f}" if cells[v] is not None else "-" for v in ("floor", "ours")]
        print(f"| {name} | {shown[0]} | {shown[1]} |")
    floor, ours = table["wall"]["floor"], table["wall"]["ours"]
    assert floor is not None
    assert ours is not None
    print(f"\nours / floor (wall per batch): {ours / floor:.2f}x")
    if args.chart is not None:
        from benchmarks.charts import grouped_bar_chart

        timed = {
            name: cells
            for name, cells in table.items()
            if name not in COUNTS and max(v or 0.0 for v in cells.values()) >= 1.0
        }
        written = grouped_bar_chart(
            args.chart,
            f"Where a driver-mode batch goes: {args.rows_per_batch:,} rows, sinks {args.sinks}, "
            f"local[2]; medians of {args.batches} batches (parts under 1 ms left out)\n"
            f"ours / floor (wall per batch) = {ours / floor:.2f}x",
            list(timed),
            [(variant, [cells[variant] for cells in timed.values()]) for variant in rows],
            "ms per batch (CPU: ms of CPU time in the batch)",
            highlight=["wall"],
            value_format="{:.1f}",
        )
        print(f"chart: {written}")


if __name__ == "__main__":
    main()
