"""Executor mode at scale: a cost model of one micro-batch from measured parts.

    .venv/bin/python -m benchmarks.cost_model [--sinks postgres,s3,delta,iceberg]
        [--parts 1,8,32,64] [--rows-per-task 100000] [--project 8,32,128]

Needs the test bed's Postgres and S3 (SeaweedFS; Iceberg: its REST catalog, tables in its table
bucket). No Spark: each part of an epoch is prepared
in this process by `prepare_part` exactly as an executor's task does (fresh sinks, opened as
workers, the part's rows written, prepared), and the epoch decided and committed by a started
executor-mode coordinator (`run_distributed_epoch`), as the driver does after Spark's job.

Measured per sink:
- per task (the median over the parts): connecting (`open`), `begin_epoch`, `pre_commit`
  (Postgres: PREPARE TRANSACTION; S3: the part's upload completed as a pending object; Delta,
  Iceberg: the part's Parquet file), `close`, and the write rate (`write_batch`, rows per second) of
  one part of `--rows-per-task` rows, all alone on the machine;
- on the driver, for an epoch of N parts (each of 1,000 rows; the driver's work does not
  depend on rows), N from `--parts`: the decision record's size and the time to make it
  durable, the commits (one per participant, one after the other, then the sink's publish,
  if any), what recovery's listing of the job's prepared participants takes with those N in
  flight (`recover_prepared`, run before the decision), and the whole protocol after the
  parts were prepared.
Projected (`--project`), for a micro-batch of N tasks of `--rows-per-task` rows, one task per
executor core, each executor on a core of its own: Spark's job overhead (`--spark-ms`: job
start to the first task, the last task to the job's end, from benchmarks/executor_profile.py)
+ one task (fixed parts + rows / rate: the tasks run in parallel) + the driver's protocol at N
(a straight line fitted through the measured N; beyond the largest N it is extrapolated,
marked "~"). The driver is the bottleneck once its protocol outgrows a task. What bounds the
servers is printed beside: Postgres holds N connections and N prepared transactions at once
(`max_connections`, `max_prepared_transactions`), S3 N pending uploads, a Delta commit N
`add` actions.
With `--background` the jobs run with `background_commits`: the protocol measured is then
what stays on the batch's path (the decision, and what of the previous epoch's phase 2 did not
end while this epoch's parts were prepared), and phase 2's own time is printed beside.
Check: `--check-cluster FILE...` reads the output of benchmarks/spark_end_to_end.py runs with
`--master cluster --cluster-workers 1|2 --variants pg-ours-executor` and prints the model's
projection at 1 and 2 tasks beside the measured addBatch.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

from benchmarks.postgres_sink import make_rows
from durable_sinks.coordinator import prepare_part
from durable_sinks.core import CommitHandle, SinkConnector
from durable_sinks.core.protocol import DistributedSink
from durable_sinks.spark import sink
from durable_sinks.spark._build import build_coordinator
from durable_sinks.spark._options import JobOptions
from durable_sinks.spark._specs import SinkSpec
from tests.services import up

#: Task-side methods timed on every sink a part builds.
TASK_PARTS = ("open", "begin_epoch", "write_batch", "pre_commit", "close")
#: Rows per part when measuring the driver's side (its work does not depend on rows).
DRIVER_PART_ROWS = 1_000
#: Spark's own overhead per executor-mode job (ms): job start to the first task's function
#: 44.7, the last task's function to the job's end 21.9 (benchmarks/executor_profile.py,
#: docs/benchmarks.md "Is executor mode faster than driver mode?").
SPARK_JOB_MS = 66.6
#: Rows per task of benchmarks/spark_end_to_end.py's cluster runs (100,000 per batch, 2 tasks).
CLUSTER_TASK_ROWS = 50_000


class Timer:
    """Milliseconds per named part, appended per call."""

    def __init__(self) -> None:
        self.calls: dict[str, list[float]] = defaultdict(list)

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.calls[name].append((time.perf_counter() - started) * 1e3)


def timed_sinks(spec: SinkSpec, timer: Timer) -> Callable[[], list[SinkConnector]]:
    """What a task calls to build its sinks, each method of TASK_PARTS timed (per part,
    summed over its calls)."""

    def build() -> list[SinkConnector]:
        built = spec.build()
        for name in TASK_PARTS:
            method = getattr(built, name)

            def timed(*args: Any, _method: Any = method, _name: str = name, **kw: Any) -> Any:
                with timer.part(_name):
                    return _method(*args, **kw)

            setattr(built, name, timed)
        return [built]

    return build


class Target:
    """One sink kind on the test bed: a fresh spec per epoch run, its decision store, and
    what bounds its server."""

    def __init__(self, kind: str, work: Path) -> None:
        self.kind = kind
        self.work = work
        testbed = up(["postgres"] if kind == "postgres" else ["s3"])
        if kind == "postgres":
            self.dsn = testbed.postgres.endpoint().conninfo()
            self.schema = f"cost_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA "{self.schema}"')
        else:
            self.s3 = testbed.s3.endpoint()
        if kind == "iceberg":
            from pyiceberg.catalog import load_catalog

            self.rest = testbed.s3.catalog_endpoint()
            self.namespace = f"cost_{uuid.uuid4().hex[:8]}"
            self.catalog = load_catalog("rest", **self.rest.catalog_properties())
            self.catalog.create_namespace(self.namespace)

    def spec(self) -> SinkSpec:
        name = uuid.uuid4().hex[:8]
        if self.kind == "postgres":
            return sink(
                "postgres", dsn=self.dsn, table=f"{self.schema}.t_{name}", create_table=True
            )
        if self.kind == "iceberg":  # the table made first: every task then only loads it
            schema = make_rows(1).schema
            self.catalog.create_table((self.namespace, f"t_{name}"), schema=schema)
            return sink(
                "iceberg",
                table=f"t_{name}",
                namespace=self.namespace,
                catalog=self.rest.catalog_properties(),
                catalog_name="rest",
            )
        from tests.support.delta_target import delta_s3_options
        from tests.support.s3_target import s3_options

        path = f"s3://{self.s3.bucket}/cost-{name}"
        if self.kind == "s3":
            return sink("s3", **s3_options(self.s3, path))
        return sink("delta", create_table=True, **delta_s3_options(self.s3, path))

    def bounds(self) -> str:
        if self.kind == "postgres":
            with psycopg.connect(self.dsn) as conn:
                shown = [
                    f"{name} {conn.execute(f'SHOW {name}').fetchone()[0]}"  # type: ignore[index]
                    for name in ("max_connections", "max_prepared_transactions")
                ]
            return "N connections and N prepared transactions at once; here " + ", ".join(shown)
        if self.kind == "s3":
            return "N multipart uploads pending until the commit"
        if self.kind == "iceberg":
            return "one commit of N data files (one per task) through the REST catalog"
        return "one commit of N add actions (one Parquet file per task)"

    def close(self) -> None:
        if self.kind == "postgres":
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{self.schema}" CASCADE')
        if self.kind == "iceberg":
            for identifier in self.catalog.list_tables(self.namespace):
                self.catalog.purge_table(identifier)
            self.catalog.drop_namespace(self.namespace)


def epoch_run(
    target: Target,
    parts: int,
    rows: int,
    timer: Timer,
    rows_table: pa.Table,
    background: bool = False,
) -> dict[str, float]:
    """One executor-mode epoch of `parts` parts of `rows` rows; the driver's costs (ms) and
    the decision record's size (bytes). With `background`, the job has `background_commits`:
    "protocol" is then what stays on the batch's path (the previous epoch's phase 2, which
    ran while this one's parts were prepared, and this one's decision), and "background" the
    time this epoch's phase 2 took after the batch returned (until `close()` ended)."""
    spec = target.spec()
    job = f"cost-{uuid.uuid4().hex[:8]}"
    store = tempfile.mkdtemp(prefix="ds-cost-", dir=target.work)
    options = JobOptions(
        job_id=job,
        execution="executor",
        decision_store=None if target.kind == "postgres" else store,
        background_commits=background,
    )
    coordinator = build_coordinator([spec], options)
    coordinator.start()
    build = timed_sinks(spec, timer)
    batches = rows_table.slice(0, rows).to_batches(10_000)
    driver: dict[str, float] = {}

    epoch = {"n": 0}

    def prepare(generation: int) -> list[CommitHandle]:
        handles: list[CommitHandle] = []
        for n in range(parts):
            part = f"p{n}-t{n}"
            handles += prepare_part(job, generation, epoch["n"], part, build, batches)
        started = time.perf_counter()
        # (Its query lists every prepared participant of the job; those of this generation
        # are then left out, as a recovery by a later generation would not.)
        coordinator.sinks[0].recover_prepared()
        driver["listing"] = (time.perf_counter() - started) * 1e3
        driver_sink = coordinator.sinks[0]
        if not isinstance(driver_sink, DistributedSink):
            raise TypeError(f"the {target.kind} sink does not support executor mode")
        listed = driver_sink.prepared_participants(epoch["n"])
        if target.kind == "postgres" and len(listed) != parts:
            raise RuntimeError(f"recovery lists {len(listed)} prepared parts of {parts}")
        return handles

    try:
        # A first epoch opens what a running job keeps open (the commit sessions); the
        # second one, measured, is what every later epoch of the job costs.
        coordinator.run_distributed_epoch(0, prepare)
        epoch["n"] = 1
        started = time.perf_counter()
        result = coordinator.run_distributed_epoch(1, prepare)
        total = (time.perf_counter() - started) * 1e3
    finally:
        started = time.perf_counter()
        coordinator.close()
        driver["background"] = (time.perf_counter() - started) * 1e3 if background else 0.0
    seconds = result.metrics.seconds
    if result.decision is None or len(result.decision.handles) != parts:
        raise RuntimeError(f"the decision names {result.decision} for {parts} parts")
    if sum(h.rows for h in result.decision.handles) != parts * rows:
        raise RuntimeError("the decision's rows differ from the rows written")
    driver["record bytes"] = float(len(json.dumps(result.decision.to_json())))
    driver["decision"] = seconds.get("decision", 0.0) * 1e3
    driver["commit"] = seconds.get("commit", 0.0) * 1e3
    driver["finish"] = seconds.get("finish", 0.0) * 1e3
    write = seconds.get("write", 0.0) * 1e3
    driver["protocol"] = total - write  # (the listing ran inside the write phase)
    return driver


def commit_floor(target: Target, parts: int) -> float:
    """The floor of an epoch's commits (ms): `parts` prepared participants made with the raw
    client and committed with it at the sink's own concurrency, nothing else (Postgres:
    COMMIT PREPARED on `commit_sessions` sessions; S3: CompleteMultipartUpload,
    COMMIT_REQUESTS at a time); 0 for a sink whose commit is one log write."""
    from concurrent.futures import ThreadPoolExecutor

    from durable_sinks.sinks.postgres import Postgres
    from durable_sinks.sinks.s3.committer import COMMIT_REQUESTS

    if target.kind == "postgres":
        table = f'"{target.schema}".floor_{uuid.uuid4().hex[:8]}'
        gids = [f"floor-{uuid.uuid4().hex[:12]}" for _ in range(parts)]
        with psycopg.connect(target.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (id bigint)")
        for gid in gids:
            with psycopg.connect(target.dsn) as conn:
                conn.execute(f"INSERT INTO {table} VALUES (1)")
                conn.execute(f"PREPARE TRANSACTION '{gid}'")
        sessions = Postgres(target.dsn, "t").commit_sessions
        conns = [psycopg.connect(target.dsn, autocommit=True) for _ in range(sessions)]
        try:
            started = time.perf_counter()
            with ThreadPoolExecutor(sessions) as pool:
                list(
                    pool.map(
                        lambda k: [
                            conns[k].execute(f"COMMIT PREPARED '{gid}'")
                            for gid in gids[k::sessions]
                        ],
                        range(sessions),
                    )
                )
            return (time.perf_counter() - started) * 1e3
        finally:
            for conn in conns:
                conn.close()
    if target.kind == "s3":
        client = target.s3.client()
        bucket = target.s3.bucket
        prefix = f"cost-floor-{uuid.uuid4().hex[:8]}"
        uploads = []
        for n in range(parts):
            key = f"{prefix}/{n}"
            upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
            etag = client.upload_part(
                Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"x" * 1024
            )["ETag"]
            uploads.append((key, upload, etag))

        def complete(item: tuple[str, str, str]) -> None:
            key, upload, etag = item
            client.complete_multipart_upload(
                Bucket=bucket,
                Key=key,
                UploadId=upload,
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
                IfNoneMatch="*",
            )

        started = time.perf_counter()
        with ThreadPoolExecutor(COMMIT_REQUESTS) as pool:
            list(pool.map(complete, uploads))
        return (time.perf_counter() - started) * 1e3
    return 0.0


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x."""
    if len(xs) == 1:
        return ys[0], 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - b * mx, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sinks", default="postgres,s3,delta")
    parser.add_argument("--parts", default="1,8,32,64", help="N parts per measured epoch")
    parser.add_argument("--rows-per-task", type=int, default=100_000)
    parser.add_argument("--project", default="1,2,8,32,128")
    parser.add_argument("--spark-ms", type=float, default=SPARK_JOB_MS)
    parser.add_argument("--check-cluster", nargs="*", type=Path, default=[])
    parser.add_argument("--chart", type=Path, help="also draw the projection into this PNG")
    parser.add_argument(
        "--background",
        action="store_true",
        help="the jobs run with background_commits: the protocol measured is what stays on "
        "the batch's path, phase 2's own time is printed beside",
    )
    args = parser.parse_args()
    parts = [int(n) for n in args.parts.split(",")]
    project = [int(n) for n in args.project.split(",")]
    work = Path(tempfile.mkdtemp(prefix="ds-cost-model-"))
    rows_table = make_rows(max(args.rows_per_task, DRIVER_PART_ROWS))
    models: dict[str, tuple[dict[str, float], float, dict[int, dict[str, float]]]] = {}
    for kind in [k for k in args.sinks.split(",") if k]:
        target = Target(kind, work)
        try:
            # Warm-up (imports, connections, the table's creation), then one big part alone.
            epoch_run(target, 1, DRIVER_PART_ROWS, Timer(), rows_table)
            task = Timer()
            epoch_run(target, 1, args.rows_per_task, task, rows_table)
            measured: dict[int, dict[str, float]] = {}
            small = Timer()
            for n in parts:
                measured[n] = epoch_run(
                    target, n, DRIVER_PART_ROWS, small, rows_table, args.background
                )
                measured[n]["floor"] = commit_floor(target, n)
            fixed = {
                name: statistics.median(small.calls[name])
                for name in TASK_PARTS
                if name != "write_batch" and small.calls[name]
            }
            write_ms = sum(task.calls["write_batch"])
            models[kind] = (fixed, args.rows_per_task / (write_ms / 1e3), measured)
            print_sink(kind, fixed, write_ms, args, measured, target.bounds())
        finally:
            target.close()
    print_projection(models, project, args)
    if args.chart is not None:
        from benchmarks.charts import grouped_bar_chart

        written = grouped_bar_chart(
            args.chart,
            f"Executor mode, projected: one micro-batch of N tasks x {args.rows_per_task:,} rows "
            "(a core per task)\nthe driver's protocol after the tasks (ms; from the parts "
            "measured by benchmarks/cost_model.py)",
            [f"N = {n}" for n in project],
            [
                (kind, [projected(model, n, args)[1] for n in project])
                for kind, model in models.items()
            ],
            "ms of the driver's protocol per micro-batch (lower is better)",
            # By value: the labels alternate above and below, so near lines stay apart.
            references=sorted(
                (
                    (f"one {kind} task", projected(model, 1, args)[0])
                    for kind, model in models.items()
                ),
                key=lambda reference: reference[1],
            ),
        )
        print(f"chart: {written}")


def print_sink(
    kind: str,
    fixed: dict[str, float],
    write_ms: float,
    args: argparse.Namespace,
    measured: dict[int, dict[str, float]],
    bounds: str,
) -> None:
    print(f"\n## {kind}\n")
    print(
        "per task (median over the parts, ms): "
        + ", ".join(f"{k} {v:.1f}" for k, v in fixed.items())
    )
    print(
        f"write of {args.rows_per_task:,} rows in one task: {write_ms:.1f} ms "
        f"({args.rows_per_task / write_ms * 1e3:,.0f} rows/s)"
    )
    print(f"server bound: {bounds}")
    print(
        "\n| parts N | decision record | decision | commits | finish | protocol after prepare "
        "| recovery's listing | floor: the N commits alone, raw client |"
        + (" phase 2 in the background |" if args.background else "")
    )
    print("|---|---|---|---|---|---|---|---|" + ("---|" if args.background else ""))
    for n, d in measured.items():
        print(
            f"| {n} | {d['record bytes']:,.0f} B | {d['decision']:.1f} ms | {d['commit']:.1f} ms "
            f"| {d['finish']:.1f} ms | {d['protocol']:.1f} ms | {d['listing']:.1f} ms "
            f"| {d['floor']:.1f} ms |" + (f" {d['background']:.1f} ms |" if args.background else "")
        )
    low, high = min(measured), max(measured)
    if low != high:
        grown = measured[high]["protocol"] / measured[low]["protocol"]
        floor = measured[high]["floor"] / measured[low]["floor"] if measured[low]["floor"] else 0
        print(
            f"\nthe driver's protocol at N = {high} / at N = {low}: {grown:.2f}x (goal <= 2x); "
            f"the raw commits alone: {floor:.2f}x"
        )


def projected(
    model: tuple[dict[str, float], float, dict[int, dict[str, float]]],
    n: int,
    args: argparse.Namespace,
) -> tuple[float, float, float, bool]:
    """(one task, the driver's protocol, the batch) in ms at n tasks; whether extrapolated."""
    fixed, rate, measured = model
    task = sum(fixed.values()) + args.rows_per_task / rate * 1e3
    xs = sorted(measured)
    a, b = fit(xs, [measured[x]["protocol"] for x in xs])
    if b <= 0:  # (noise at small N): no growth measured, the largest N's time
        a, b = measured[xs[-1]]["protocol"], 0.0
    protocol = measured[n]["protocol"] if n in measured else a + b * n
    return task, protocol, args.spark_ms + task + protocol, n > max(xs)


def print_projection(
    models: dict[str, tuple[dict[str, float], float, dict[int, dict[str, float]]]],
    project: list[int],
    args: argparse.Namespace,
) -> None:
    print(
        f"\n## projection: a micro-batch of N tasks x {args.rows_per_task:,} rows, one core per "
        f"task, Spark's job overhead {args.spark_ms:.1f} ms\n"
    )
    print("| sink | N | rows | one task | driver protocol | batch | rows/s | driver share |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, model in models.items():
        for n in project:
            task, protocol, batch, extrapolated = projected(model, n, args)
            mark = "~" if extrapolated else ""
            rows = n * args.rows_per_task
            print(
                f"| {kind} | {n} | {rows:,} | {task:.0f} ms | {mark}{protocol:.0f} ms | "
                f"{mark}{batch:.0f} ms | {rows / batch * 1e3:,.0f} | {protocol / batch:.0%} |"
            )
    for kind, model in models.items():
        task, _, _, _ = projected(model, 1, args)
        measured = model[2]
        xs = sorted(measured)
        a, b = fit(xs, [measured[x]["protocol"] for x in xs])
        if b > 0:
            print(
                f"{kind}: driver protocol ~{a:.1f} + {b:.2f} ms x N; it outgrows one task "
                f"({task:.0f} ms) at N ~ {max(0.0, (task - a) / b):,.0f}"
            )
    if args.check_cluster and "postgres" in models:
        check_cluster(models["postgres"], args)


def check_cluster(
    model: tuple[dict[str, float], float, dict[int, dict[str, float]]], args: argparse.Namespace
) -> None:
    """The model at the runs' task count against their measured addBatch (executor mode)."""
    print("\n| cluster run | tasks per batch | measured addBatch | model | model / measured |")
    print("|---|---|---|---|---|")
    pattern = re.compile(r"\| postgres, ours exactly-once, executor mode \|.*\| (\d+) ms \|")
    for path in args.check_cluster:
        text = path.read_text()
        found = pattern.search(text)
        workers = re.search(r"executors on (\d+) worker", text)
        if found is None or workers is None:
            raise RuntimeError(f"{path}: no executor-mode cluster result in it")
        measured = float(found.group(1))
        # Each micro-batch has two input splits: two tasks of half its rows, on one core (in
        # turn) or on two.
        cores = int(workers.group(1))
        fixed, rate, _ = model
        task = sum(fixed.values()) + CLUSTER_TASK_ROWS / rate * 1e3
        _, protocol, _, _ = projected(model, 2, args)
        batch = args.spark_ms + task * (2 / cores) + protocol
        print(
            f"| {path.name} | 2 on {cores} core(s) | {measured:.0f} ms | {batch:.0f} ms | "
            f"{batch / measured:.2f}x |"
        )


if __name__ == "__main__":
    main()
