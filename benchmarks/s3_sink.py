"""Our files sink vs Spark's own exactly-once file sink; our S3 sink vs raw boto3.

    .venv/bin/python -m benchmarks.s3_sink            # --only files|s3|all, --rounds 5, --chart PNG
    .venv/bin/python -m benchmarks.s3_sink --only s3 --rounds 3 --profile 5

Section "files" (`--only files`, the default): whole Spark streaming queries in one `local[2]`
session over the same micro-batches. The input, 1,000,000 events (id bigint, ts timestamp,
user string, amount double, payload string of ~80 bytes), is written once as 20 Parquet files
of 50,000 rows; the queries read them with
`readStream.format("parquet").schema(...).option("maxFilesPerTrigger", 2)` and
`trigger(availableNow=True)`: 10 micro-batches of 100,000 rows, each read as two input splits,
one task per core (`--files-per-batch 1`: 10 files of 100,000, which Spark reads as one split,
so every batch is one task on one core). Variants, each into a fresh folder, checkpoint, job
id and decision store:
- spark: `writeStream.format("parquet").option("path", ...)`, Spark's exactly-once file sink
  (files named per task, committed by the batch's entry in `_spark_metadata`);
- ours: `foreachBatch(durable_sink("files", path=..., job_id=..., decision_store=<dir>))` in
  driver mode (the default: the batch streamed to the driver as Arrow, one Parquet file per
  epoch written, fsynced, published by rename, the decision fsynced in the store);
- ours-executor: the same with `execution="executor"` (each task writes and prepares its part,
  the driver decides and publishes);
- diagnostics, run only when named in `--variants`: ours-nofsync (driver mode with `fsync=False`
  in the sink: Spark's sink does not fsync its files either; the decision store keeps its
  fsync, which exactly-once demands); floor (a foreachBatch that only streams the batch to the
  driver as Arrow: the least any writer in the driver pays); floor-executor (a foreachBatch
  whose `mapInArrow` only hands each partition to a Python worker: executor mode's Spark job
  without our sink); spark-noop (`format("noop")`: the batch read, nothing written);
  spark-zstd1 (Spark's sink at zstd level 1, Arrow's default).
Both write zstd (`spark.sql.parquet.compression.codec=zstd`; ours' default), each at its
library's default level (parquet-java 3, Arrow 1). Each variant first runs once on one
micro-batch (class loading, Python workers), then the variants alternate in the same order for
`--rounds` rounds, `--settle` seconds of rest before each run. Timed: from building the sink
(ours starts its coordinator there) through `start()` to `awaitTermination()`, nothing
subtracted; per micro-batch, Spark's `addBatch` and `triggerExecution` from
`query.recentProgress`. Every run is checked before its output is deleted: Spark's progress
shows 10 batches and 1M rows, and the output read back with pyarrow (ours:
`epoch=*/part=*/*.parquet`, each part folder with its marker and nothing left in `_staging`;
Spark's: the files its `_spark_metadata` log adds) holds exactly ids 0..999,999 once each, and
the same sums of amount, timestamps and string bytes as the input; anything else raises.

After the rounds, `--profile N` (10 by default) splits our driver-mode batch outside Spark,
N times: one micro-batch as our writer receives it (the record batches `socket_batches`
yields) through each step of the files sink alone (Parquet encoding as the sink does it, one
row group per record batch; the SHA-256 of each batch's IPC serialisation; fsync), against
alternatives (zstd level 3; one row group; two files encoded in two threads; CRC-32), and
through a coordinator with the files sink and a local-directory store (its phases). Then
`--history` epochs are published and a worker's `FolderSink.open()`, which every executor-mode
task runs, is timed on them.

Section "s3" (`--only s3`): `--batches` epochs of `--rows-per-batch` events, each handed over
as 10,000-row record batches (what Spark hands a writer), written as zstd Parquet to the test
bed's SeaweedFS by each variant into a fresh prefix: ours (a coordinator with the S3 sink and
its default local-directory decision store, fsync on: multipart upload, decision, completion,
epoch marker); what a user would write instead, pyarrow's `pq.write_table` and
`dataset.write_dataset` of the epoch through `pyarrow.fs.S3FileSystem`; and the floors,
Parquet encoding of the epoch plus one raw boto3 upload of its bytes (one PUT, or a multipart
upload), no protocol. Every side encodes at pyarrow's defaults (zstd level 1, dictionaries,
statistics). After a warm-up run of each, the variants run `--rounds` times, the order rotating
each round; every run's output is read back (ours through its epoch markers, with no upload
left incomplete) and must hold exactly the input's ids. Reported: per-epoch medians and the
ratios against ours; ours' coordinator phases; with `--profile N`, each piece of an epoch's
work (encoding, hashing, each request) alone, N times. `--s3-variants` adds ours-before (10,000-
row row groups, every request and the replay check's row hashes in turn: the sink before row
groups were gathered and requests and hashes overlapped the encoding) and ours-inline-tally
(only the row hashes in turn) for an A/B in the same run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.spark_end_to_end import timed_call
from durable_sinks.coordinator import Coordinator
from durable_sinks.core import OpenContext
from durable_sinks.core.content import summarise
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import MARKER, STAGING, Files, FolderSink
from durable_sinks.spark import durable_sink
from durable_sinks.spark._arrow import socket_batches
from tests.services import up

UTC = timezone.utc

SPARK_SCHEMA = "id BIGINT, ts TIMESTAMP, user STRING, amount DOUBLE, payload STRING"
START_US = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1e6)
CODEC = "zstd"
SIZE = "bytes of the file: "  # (profile entries that are sizes, not times)
ZSTD_LEVEL = "parquet.compression.codec.zstd.level"  # parquet-java's; default 3

FILE_VARIANTS = {
    "spark": "Spark's file sink (format parquet, _spark_metadata)",
    "ours": "ours, driver mode (default)",
    "ours-executor": "ours, executor mode",
    "ours-nofsync": "ours, driver mode, sink fsync off (diagnostic)",
    "floor": "floor: batch streamed to the driver as Arrow, dropped (diagnostic)",
    "floor-executor": "executor floor: mapInArrow handing the batch to Python workers, dropped "
    "(diagnostic)",
    "spark-zstd1": "Spark's file sink, zstd level 1 as Arrow's (diagnostic)",
    "spark-noop": "Spark's noop sink: the batch read, nothing written (diagnostic)",
}
DEFAULT_VARIANTS = ("spark", "ours", "ours-executor")
OURS = ("ours", "ours-executor", "ours-nofsync")
#: Per micro-batch of ours (ms): our foreachBatch call; the call minus the coordinator's
#: phases (driver mode: starting Spark's job and waiting for its record batches); the sink's
#: write_batch calls (driver mode: Parquet encoding and the checksum; executor mode: the whole
#: Spark job that writes and prepares the parts); the protocol (pre_commit + decision +
#: commit); lookup, begin and finish.
PARTS = ("call", "read", "write", "protocol", "other")


# -- input ----------------------------------------------------------------------------------------
def make_events(count: int, first_id: int = 0, seed: int = 17) -> pa.Table:
    """`count` events: id, ts (one per ms with jitter), user (50,000 distinct), amount, and a
    payload of 83 bytes (a JSON-like line: repeated keys, a few random fields and 16 random hex
    digits), so that it compresses only partly."""
    rng = np.random.default_rng(seed + first_id)
    ids = np.arange(first_id, first_id + count, dtype=np.int64)
    ts = START_US + ids * 1000 + rng.integers(0, 1000, count)
    users = rng.integers(0, 50_000, count)
    pages = rng.integers(0, 5_000, count)
    tokens = rng.integers(0, 2**62, count)
    amounts = np.round(rng.gamma(2.0, 20.0, count), 2)
    flags = rng.integers(0, 2, count)
    payload = [
        f'{{"page":"/products/{page:04d}","ref":"campaign-{user % 97:02d}","tok":"{token:016x}",'
        f'"n":{i % 7},"ok":{flag}}}'
        for i, page, user, token, flag in zip(
            ids.tolist(),
            pages.tolist(),
            users.tolist(),
            tokens.tolist(),
            flags.tolist(),
            strict=True,
        )
    ]
    return pa.table(
        {
            "id": pa.array(ids),
            "ts": pa.array(ts, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "user": pa.array([f"user-{u:05d}" for u in users.tolist()]),
            "amount": pa.array(amounts, pa.float64()),
            "payload": pa.array(payload),
        }
    )


def write_source(folder: Path, files: int, rows_per_file: int) -> Fingerprint:
    """`files` Parquet files of `rows_per_file` events (one row group each), written before
    any query looks; the fingerprint of all of them."""
    folder.mkdir(parents=True)
    fingerprint = Fingerprint()
    for n in range(files):
        table = make_events(rows_per_file, first_id=n * rows_per_file)
        pq.write_table(table, folder / f"events-{n:05d}.parquet")
        fingerprint.add(table)
    return fingerprint


@dataclass
class Fingerprint:
    """What a correct copy of the events must show: every id once, and the same sums."""

    rows: int = 0
    id_sum: int = 0
    ts_offset_sum: int = 0  # microseconds after START_US (small enough not to overflow)
    amount_sum: float = 0.0
    text_bytes: int = 0
    ids: list[pa.Array] = field(default_factory=list, repr=False)

    def add(self, table: pa.Table) -> None:
        ids = table.column("id").combine_chunks()
        ts = table.column("ts").combine_chunks()
        micros = ts.cast(pa.int64())  # Spark writes INT96, which pyarrow reads in ns
        if ts.type.unit == "ns":
            micros = pc.divide(micros, 1000)
        offsets = pc.subtract(micros, START_US)
        self.rows += table.num_rows
        self.id_sum += int(pc.sum(ids).as_py())
        self.ts_offset_sum += int(pc.sum(offsets).as_py())
        self.amount_sum += float(pc.sum(table.column("amount")).as_py())
        for name in ("user", "payload"):
            self.text_bytes += int(pc.sum(pc.binary_length(table.column(name))).as_py())
        self.ids.append(ids)

    def same_as(self, other: Fingerprint) -> str | None:
        """None when `other` (the input's) matches; else what differs."""
        ids = pa.chunked_array(self.ids, pa.int64())
        distinct = int(pc.count_distinct(ids).as_py()) if self.rows else 0
        if self.rows != other.rows or distinct != other.rows:
            return f"{self.rows} rows, {distinct} distinct ids; {other.rows} written"
        for name in ("id_sum", "ts_offset_sum", "text_bytes"):
            if getattr(self, name) != getattr(other, name):
                return f"{name} {getattr(self, name)} != {getattr(other, name)}"
        if not math.isclose(self.amount_sum, other.amount_sum, rel_tol=1e-9):
            return f"amount sum {self.amount_sum} != {other.amount_sum}"
        return None


def check_files(files: list[Path], expected: Fingerprint, what: str) -> None:
    found = Fingerprint()
    for path in files:
        found.add(pq.read_table(path))
    problem = found.same_as(expected)
    if problem is not None:
        raise RuntimeError(f"{what}: {problem}")


def check_ours(root: Path, expected: Fingerprint, batches: int) -> list[Path]:
    """Our dataset's files, checked: one epoch folder per batch, every part with its marker,
    nothing left staged, exactly the input's rows."""
    staged = list((root / STAGING).iterdir())
    if staged:
        raise RuntimeError(f"{root}: left in {STAGING}: {[p.name for p in staged]}")
    files = sorted(root.glob("epoch=*/part=*/*.parquet"))
    epochs = {f.parent.parent.name for f in files}
    if len(epochs) != batches:
        raise RuntimeError(f"{root}: {len(epochs)} epoch folders, {batches} batches")
    unmarked = [f for f in files if not (f.parent / MARKER).is_file()]
    if unmarked:
        raise RuntimeError(f"{root}: parts without {MARKER}: {unmarked}")
    check_files(files, expected, f"ours at {root}")
    return files


def spark_committed_files(root: Path) -> list[Path]:
    """The files Spark's file sink committed: every `add` of its `_spark_metadata` log (batch
    files `<n>` and compacted `<n>.compact`: a header line, then one JSON entry per file)
    less every `delete`."""
    added: set[str] = set()
    deleted: set[str] = set()
    for entry in sorted((root / "_spark_metadata").iterdir()):
        if not entry.name.split(".")[0].isdigit():
            continue  # .crc checksum files, temporary files
        lines = entry.read_text().splitlines()
        if not lines or not lines[0].startswith("v"):
            raise RuntimeError(f"{entry}: not a file sink log entry")
        for line in lines[1:]:
            item = json.loads(line)
            path = unquote(urlparse(item["path"]).path)
            (added if item["action"] == "add" else deleted).add(path)
    return sorted(Path(p) for p in added - deleted)


def check_spark(root: Path, expected: Fingerprint) -> list[Path]:
    files = spark_committed_files(root)
    check_files(files, expected, f"Spark's sink at {root}")
    return files


# -- the streaming queries ------------------------------------------------------------------------
@dataclass
class Run:
    seconds: float
    add_batch_ms: list[float]
    trigger_ms: list[float]
    files: int = 0
    output_bytes: int = 0
    parts: dict[str, list[float]] = field(default_factory=dict)


class FilesBench:
    """The session and the input; `run(variant)` runs one checked query."""

    def __init__(self, spark: Any, work: Path, files_per_batch: int, timeout: float) -> None:
        self.spark = spark
        self.work = work
        self.files_per_batch = files_per_batch
        self.timeout = timeout

    def fresh(self, kind: str) -> Path:
        return self.work / f"{kind}-{uuid.uuid4().hex[:12]}"

    def run(self, variant: str, source: Path, expected: Fingerprint, batches: int) -> Run:
        if variant == "spark":
            return self.spark_sink(source, expected, batches)
        if variant == "ours":
            return self.ours(source, expected, batches)
        if variant == "ours-executor":
            return self.ours(source, expected, batches, execution="executor")
        if variant == "ours-nofsync":
            return self.ours(source, expected, batches, fsync=False)
        if variant == "floor":
            return self.floor(source, expected, batches)
        if variant == "floor-executor":
            return self.floor_executor(source, expected, batches)
        if variant == "spark-zstd1":
            return self.spark_sink(source, expected, batches, {ZSTD_LEVEL: "1"})
        if variant == "spark-noop":
            return self.query(source, expected, batches, lambda w: w.format("noop").start())
        raise ValueError(variant)

    def query(
        self, source: Path, expected: Fingerprint, batches: int, start: Callable[[Any], Any]
    ) -> Run:
        """Stream `source` into `start(DataStreamWriter)`, which builds the sink and returns
        the started query; time it; check Spark's progress reports."""
        checkpoint = self.fresh("checkpoint")
        stream = (
            self.spark.readStream.format("parquet")
            .schema(SPARK_SCHEMA)
            .option("maxFilesPerTrigger", self.files_per_batch)
            .load(str(source))
        )
        writer = stream.writeStream.option("checkpointLocation", str(checkpoint)).trigger(
            availableNow=True
        )
        started = time.perf_counter()
        query = start(writer)
        finished = query.awaitTermination(self.timeout)  # raises the query's error, if any
        elapsed = time.perf_counter() - started
        if not finished:
            query.stop()
            raise RuntimeError(f"the query did not finish within {self.timeout} s")
        progress = [p for p in query.recentProgress if _progress(p, "numInputRows") > 0]
        seen = sum(int(_progress(p, "numInputRows")) for p in progress)
        if len(progress) != batches or seen != expected.rows:
            raise RuntimeError(
                f"expected {batches} batches, {expected.rows} rows; Spark reports "
                f"{len(progress)}, {seen}"
            )
        shutil.rmtree(checkpoint, ignore_errors=True)
        durations = [_progress(p, "durationMs") for p in progress]
        return Run(
            elapsed,
            [float(d["addBatch"]) for d in durations],
            [float(d["triggerExecution"]) for d in durations],
        )

    def spark_sink(
        self,
        source: Path,
        expected: Fingerprint,
        batches: int,
        options: dict[str, str] | None = None,
    ) -> Run:
        out = self.fresh("spark")

        def start(writer: Any) -> Any:
            # The sink's options also reach the Hadoop configuration its Parquet writer reads.
            writer = writer.format("parquet").option("path", str(out))
            return writer.options(**(options or {})).start()

        run = self.query(source, expected, batches, start)
        files = check_spark(out, expected)
        run.files, run.output_bytes = len(files), sum(f.stat().st_size for f in files)
        shutil.rmtree(out)
        return run

    def ours(
        self,
        source: Path,
        expected: Fingerprint,
        batches: int,
        *,
        execution: str = "driver",
        fsync: bool = True,
    ) -> Run:
        out, store = self.fresh("ours"), self.fresh("store")
        parts: dict[str, list[float]] = {name: [] for name in PARTS}
        writers: list[Any] = []

        def start(stream_writer: Any) -> Any:
            writer = durable_sink(
                "files",
                path=str(out),
                job_id=f"bench-files-{uuid.uuid4().hex[:12]}",
                decision_store=str(store),
                execution=execution,
                fsync=fsync,
            )
            writers.append(writer)

            def fn(df: Any, batch_id: int) -> None:
                metrics = timed_call(writer, df, batch_id, parts)
                other = metrics.total_seconds - metrics.seconds["write"] - metrics.protocol_seconds
                parts["other"].append(other * 1e3)

            return stream_writer.foreachBatch(fn).start()

        try:
            run = self.query(source, expected, batches, start)
        finally:
            for writer in writers:
                writer.close()
        files = check_ours(out, expected, batches)
        run.files, run.output_bytes = len(files), sum(f.stat().st_size for f in files)
        run.parts = parts
        shutil.rmtree(out)
        shutil.rmtree(store)
        return run

    def floor(self, source: Path, expected: Fingerprint, batches: int) -> Run:
        def fn(df: Any, batch_id: int) -> None:
            for _ in socket_batches(df, job="floor", epoch=batch_id):
                pass

        return self.query(source, expected, batches, lambda w: w.foreachBatch(fn).start())

    def floor_executor(self, source: Path, expected: Fingerprint, batches: int) -> Run:
        """What executor mode's Spark job costs without our sink: each task hands its
        partition to a Python worker as Arrow (mapInArrow), which drops it and returns one
        row, collected by the driver."""

        def fn(df: Any, batch_id: int) -> None:
            df.mapInArrow(_drop, "rows long").collect()

        return self.query(source, expected, batches, lambda w: w.foreachBatch(fn).start())


def _drop(batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
    rows = sum(batch.num_rows for batch in batches)
    yield pa.record_batch([pa.array([rows], pa.int64())], names=["rows"])


def _progress(progress: Any, name: str) -> Any:
    """A field of a StreamingQueryProgress (an object in PySpark 4, a dict before)."""
    return progress[name] if isinstance(progress, dict) else getattr(progress, name)


# -- where our driver-mode batch goes, outside Spark --------------------------------------------
def profile(
    spark: Any, batch: list[Path], work: Path, repeats: int, history: int
) -> dict[str, list[float]]:
    """Seconds per repeat of each step, on one micro-batch (the files `batch`) as our driver
    mode receives it."""
    df = spark.read.schema(SPARK_SCHEMA).parquet(*map(str, batch))
    timings: dict[str, list[float]] = {}
    folder = work / "profile"
    folder.mkdir()

    def timed(name: str, step: Callable[..., object], *args: Any) -> None:
        started = time.perf_counter()
        step(*args)
        timings.setdefault(name, []).append(time.perf_counter() - started)

    batches: list[pa.RecordBatch] = []
    for n in range(repeats):
        batches.clear()
        timed("read: socket_batches (Spark job, Arrow to the driver)", _read, df, batches)
        table = pa.Table.from_batches(batches)
        sink_file = folder / f"sink-{n}.parquet"
        timed("encode: write_batch per record batch (as the sink)", _encode, batches, sink_file)
        timed("fsync of that file", _fsync, sink_file)
        timed(
            "encode: as the sink, zstd level 3 (parquet-java's default)",
            _encode,
            batches,
            folder / f"level3-{n}.parquet",
            3,
        )
        timed(
            "encode: one write_table, one row group",
            _write_table,
            table,
            folder / f"one-{n}.parquet",
        )
        timed(
            "encode: two threads, each one file and one row group of half the batches",
            _encode_in_two,
            batches,
            folder / f"two-{n}",
        )
        timed("checksum: SHA-256 of batch.serialize() (as the sink)", _sha256, batches)
        timed("checksum: CRC-32 of batch.serialize()", _crc32, batches)
        timed("checksum: serialize() alone", _serialize, batches)
        epoch = _sink_epoch(batches, work / f"profile-sink-{n}")
        for phase, seconds in epoch.items():
            timings.setdefault(f"coordinator + files sink: {phase}", []).append(seconds)
        for entry in sorted(folder.iterdir()):
            kind = entry.name.split("-")[0]  # sink, level3, one
            timings[f"{SIZE}{kind}"] = [float(entry.stat().st_size)]
            entry.unlink()
    timings["record batches per micro-batch"] = [float(len(batches))]
    shutil.rmtree(folder)
    if history:
        name = f"executor mode, each task: FolderSink.open() after {history:,} epochs of 2 parts"
        timings[name] = _open_after(history, work / "history", repeats=3)
    return timings


def _open_after(epochs: int, root: Path, repeats: int) -> list[float]:
    """Seconds of a worker's FolderSink.open() (what every executor-mode task does before it
    writes) on a dataset that has published `epochs` epochs of two parts each."""
    job = "profile-history"
    marker = json.dumps({"participant": "x", "details": {"job_id": job}}).encode()
    for epoch in range(epochs):
        for part in ("p0-t0", "p1-t1"):
            folder = root / f"epoch={epoch}" / f"part={part}"
            folder.mkdir(parents=True)
            (folder / MARKER).write_bytes(marker)
    seconds = []
    for attempt in range(repeats):
        sink = FolderSink(Files(str(root)))
        started = time.perf_counter()
        sink.open(OpenContext(job, "files", 1, worker=True, part=f"p0-t{attempt + 2}"))
        seconds.append(time.perf_counter() - started)
        sink.close()
    shutil.rmtree(root)
    return seconds


def _write_table(table: pa.Table, path: Path) -> None:
    pq.write_table(table, path, compression=CODEC)


def _encode_in_two(batches: list[pa.RecordBatch], stem: Path) -> None:
    """Two files encoded at once (pyarrow releases the GIL while it encodes)."""
    half = len(batches) // 2
    with ThreadPoolExecutor(2) as pool:
        for done in [
            pool.submit(
                _write_table, pa.Table.from_batches(batches[:half]), stem.with_suffix(".a")
            ),
            pool.submit(
                _write_table, pa.Table.from_batches(batches[half:]), stem.with_suffix(".b")
            ),
        ]:
            done.result()


def _read(df: Any, into: list[pa.RecordBatch]) -> None:
    into.extend(socket_batches(df, job="profile"))


def _encode(batches: list[pa.RecordBatch], path: Path, level: int | None = None) -> None:
    """What FolderSink does: one ParquetWriter, write_batch per record batch (a row group
    each), close."""
    with pq.ParquetWriter(
        path, batches[0].schema, compression=CODEC, compression_level=level
    ) as writer:
        for batch in batches:
            writer.write_batch(batch)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(batches: Iterable[pa.RecordBatch]) -> str:
    digest = hashlib.sha256()
    for batch in batches:
        digest.update(batch.serialize())
    return digest.hexdigest()


def _serialize(batches: Iterable[pa.RecordBatch]) -> int:
    return sum(batch.serialize().size for batch in batches)


def _crc32(batches: Iterable[pa.RecordBatch]) -> int:
    crc = 0
    for batch in batches:
        crc = zlib.crc32(batch.serialize(), crc)
    return crc


def _sink_epoch(batches: list[pa.RecordBatch], root: Path) -> dict[str, float]:
    """One epoch through a coordinator with the files sink and a local-directory store, both
    fsyncing (driver mode without Spark): seconds per phase, and the whole run_epoch."""
    coordinator = Coordinator(
        f"profile-{uuid.uuid4().hex[:8]}",
        [FolderSink(Files(str(root / "out")))],
        LocalDirectoryStore(root / "store"),
    )
    coordinator.start()
    try:
        started = time.perf_counter()
        result = coordinator.run_epoch(0, iter(batches))
        whole = time.perf_counter() - started
    finally:
        coordinator.close()
    shutil.rmtree(root)
    phases = {k: v for k, v in result.metrics.seconds.items() if v > 0}
    return {**phases, "run_epoch": whole}


# -- the files section --------------------------------------------------------------------------
def files_section(args: argparse.Namespace) -> None:
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(FILE_VARIANTS)
    if unknown:
        raise SystemExit(
            f"unknown variants {sorted(unknown)}; choose from {', '.join(FILE_VARIANTS)}"
        )
    testbed = up(["spark"])
    work = Path(tempfile.mkdtemp(prefix="ds-files-bench-")).resolve()
    began = time.perf_counter()
    per_file = args.rows_per_batch // args.files_per_batch
    expected = write_source(work / "in", args.batches * args.files_per_batch, per_file)
    warm = write_source(work / "warmup", args.files_per_batch, per_file)
    input_bytes = sum(f.stat().st_size for f in (work / "in").iterdir())
    spark = testbed.spark.session("bench-files", **{"spark.sql.parquet.compression.codec": CODEC})
    spark.sparkContext.setLogLevel("ERROR")
    bench = FilesBench(spark, work, args.files_per_batch, args.timeout)
    runs: dict[str, list[Run]] = {v: [] for v in variants}
    timings: dict[str, list[float]] = {}
    try:
        for variant in variants:
            bench.run(variant, work / "warmup", warm, 1)
        for round_ in range(args.rounds):
            for variant in variants:
                time.sleep(args.settle)
                run = bench.run(variant, work / "in", expected, args.batches)
                runs[variant].append(run)
                print(
                    f"round {round_ + 1} {variant:14s} {run.seconds:6.2f} s  addBatch median "
                    f"{statistics.median(run.add_batch_ms):4.0f} ms",
                    flush=True,
                )
        if args.profile:
            first = sorted((work / "in").iterdir())[: args.files_per_batch]
            timings = profile(spark, first, work, args.profile, args.history)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    report_files(runs, args, input_bytes)
    chart = chart_path(args, "files")
    if chart is not None and "spark" in runs:
        chart_files(runs, args, chart)
    if timings:
        report_profile(timings, args)
    print(f"\nwhole section: {time.perf_counter() - began:.0f} s")


def report_files(runs: dict[str, list[Run]], args: argparse.Namespace, input_bytes: int) -> None:
    rows = args.rows_per_batch * args.batches
    print(
        f"\n{rows:,} events (id bigint, ts timestamp, user string, amount double, payload "
        f"~80 B; input {input_bytes / 1e6:.1f} MB of Parquet) in {args.batches} micro-batches "
        f"of {args.rows_per_batch:,} ({args.files_per_batch} input files each), availableNow, "
        f"local[2], {CODEC}; {args.rounds} rounds; medians"
    )
    print(
        "\n| variant | end to end | rows/s | addBatch | triggerExecution | files | output | "
        "runs (s) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for variant, done in runs.items():
        middle = statistics.median(r.seconds for r in done)
        add = statistics.median(ms for r in done for ms in r.add_batch_ms)
        trigger = statistics.median(ms for r in done for ms in r.trigger_ms)
        size = statistics.median(r.output_bytes for r in done)
        files = statistics.median(r.files for r in done)
        output = f"{size / 1e6:.1f} MB" if size else "-"
        print(
            f"| {FILE_VARIANTS[variant]} | {middle:.2f} s | {rows / middle:,.0f} | {add:.0f} ms "
            f"| {trigger:.0f} ms | {files:.0f} | {output} "
            f"| {', '.join(f'{r.seconds:.2f}' for r in done)} |"
        )

    ours = [v for v in runs if v in OURS]
    if ours:
        print(
            "\nours per micro-batch, medians (ms): Spark's addBatch; our foreachBatch call; in "
            "it, outside the coordinator's phases (driver: starting Spark's job and waiting for "
            "its record batches); the sink's writes (driver: Parquet encoding + checksum; "
            "executor: the whole Spark job writing and preparing the parts); the protocol "
            "(pre_commit + decision + commit); lookup, begin, finish"
        )
        print("\n| variant | addBatch | call | outside phases | sink write | protocol | other |")
        print("|---|---|---|---|---|---|---|")
        for variant in ours:
            done = runs[variant]
            cells = [statistics.median(ms for r in done for ms in r.add_batch_ms)]
            cells += [statistics.median(ms for r in done for ms in r.parts[p]) for p in PARTS]
            print(f"| {FILE_VARIANTS[variant]} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")

    ours = [v for v in runs if v in (*OURS, "floor", "floor-executor")]
    for baseline in (v for v in ("spark", "spark-zstd1") if v in runs):
        print(
            f"\nratio {FILE_VARIANTS[baseline]} / ours (time; > 1: ours faster; goal >= 1x): "
            "end to end (of the medians; median of the per-round ratios), addBatch medians, "
            "triggerExecution medians"
        )
        for variant in ours:
            ratios = _ratios(runs[baseline], runs[variant])
            print(
                f"  / {FILE_VARIANTS[variant]}: end to end {ratios[END_TO_END]:.2f}x "
                f"({ratios[PER_ROUND]:.2f}x), addBatch {ratios['addBatch']:.2f}x, "
                f"triggerExecution {ratios['triggerExecution']:.2f}x"
            )
    if "spark-noop" in runs:
        noop = statistics.median(ms for r in runs["spark-noop"] for ms in r.add_batch_ms)
        print(f"\naddBatch over Spark's noop sink (same read, nothing written: {noop:.0f} ms):")
        for variant in (v for v in runs if v != "spark-noop"):
            add = statistics.median(ms for r in runs[variant] for ms in r.add_batch_ms)
            print(f"  {FILE_VARIANTS[variant]}: +{add - noop:.0f} ms")


END_TO_END = "end to end (medians)"
PER_ROUND = "end to end (median of the rounds' ratios)"


def _ratios(baseline: list[Run], ours: list[Run]) -> dict[str, float]:
    """Baseline's time / ours: end to end (of the medians, and the median of the per-round
    ratios), and per batch (Spark's addBatch and triggerExecution medians)."""

    def median_ms(done: list[Run], name: str) -> float:
        return float(statistics.median(ms for r in done for ms in getattr(r, name)))

    return {
        END_TO_END: statistics.median(r.seconds for r in baseline)
        / statistics.median(r.seconds for r in ours),
        PER_ROUND: statistics.median(
            b.seconds / o.seconds for b, o in zip(baseline, ours, strict=True)
        ),
        "addBatch": median_ms(baseline, "add_batch_ms") / median_ms(ours, "add_batch_ms"),
        "triggerExecution": median_ms(baseline, "trigger_ms") / median_ms(ours, "trigger_ms"),
    }


def chart_files(runs: dict[str, list[Run]], args: argparse.Namespace, path: Path) -> None:
    """Spark's file sink's time / each of ours (and the floors, if run): > 1, ours faster."""
    from benchmarks.charts import RATIO, grouped_bar_chart

    ours = [v for v in runs if v in (*OURS, "floor", "floor-executor")]
    ratios = [_ratios(runs["spark"], runs[variant]) for variant in ours]
    written = grouped_bar_chart(
        path,
        f"Files sink vs Spark's exactly-once file sink: {args.batches} micro-batches of "
        f"{args.rows_per_batch:,} rows, local[2], {args.rounds} rounds\n"
        "Spark's time / ours (higher is better: ours faster)",
        [FILE_VARIANTS[variant] for variant in ours],
        [(name, [r[name] for r in ratios]) for name in ratios[0]],
        "x (Spark's file sink's time / ours)",
        highlight=[FILE_VARIANTS[v] for v in ours if v in OURS],
        references=[("Spark = 1x = goal", 1.0)],
        value_format=RATIO,
    )
    print(f"chart: {written}")


def chart_path(args: argparse.Namespace, section: str) -> Path | None:
    """Where `section`'s chart goes: `--chart` itself when one section runs, else with
    `-<section>` before its suffix."""
    path: Path | None = args.chart
    if path is None or args.only != "all":
        return path
    return path.with_name(f"{path.stem}-{section}{path.suffix}")


def report_profile(timings: dict[str, list[float]], args: argparse.Namespace) -> None:
    count = timings.pop("record batches per micro-batch")[0]
    print(
        f"\nour driver-mode batch outside Spark ({args.rows_per_batch:,} rows as "
        f"{count:.0f} record batches from socket_batches; median of {args.profile}, ms):"
    )
    sizes = {k.removeprefix(SIZE): v[0] for k, v in timings.items() if k.startswith(SIZE)}
    print("\n| step | median | min |\n|---|---|---|")
    for name, seconds in timings.items():
        if not name.startswith(SIZE):
            median, least = statistics.median(seconds) * 1e3, min(seconds) * 1e3
            print(f"| {name} | {median:.1f} | {least:.1f} |")
    print(
        "\nfile sizes: as the sink "
        f"{sizes['sink'] / 1e6:.2f} MB, zstd level 3 {sizes['level3'] / 1e6:.2f} MB, one row "
        f"group {sizes['one'] / 1e6:.2f} MB"
    )


# -- the S3 section -----------------------------------------------------------------------------
S3_VARIANTS = {
    "ours": "ours: coordinator + S3 sink, exactly-once",
    "write_table": "pyarrow pq.write_table via S3FileSystem",
    "write_dataset": "pyarrow dataset.write_dataset via S3FileSystem",
    "floor-put": "floor: encode + one PUT",
    "floor-multipart": "floor: encode + multipart upload",
    "ours-inline-tally": "ours, the replay check's row hashes in turn (diagnostic)",
    "ours-background": "ours with background_commits (phase 2 beside the next epoch)",
    "ours-before": "ours as before: 10,000-row row groups, requests and row hashes in turn "
    "(diagnostic)",
}
S3_DEFAULT_VARIANTS = ("ours", "write_table", "write_dataset", "floor-put", "floor-multipart")
S3_PEERS = ("write_table", "write_dataset")
S3_FLOORS = ("floor-put", "floor-multipart")


@dataclass
class S3Run:
    """One variant's run over every epoch: the whole time, each epoch's, and ours' phases."""

    seconds: float
    epoch_ms: list[float]
    phases: dict[str, list[float]] = field(default_factory=dict)
    row_groups: int = 0


class _Inline:
    """An executor that runs each task at once, in the caller's thread: the S3 sink's
    requests and the replay check's row hashes as they were before they overlapped the
    encoding (ours-before, ours-inline-tally)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        from concurrent.futures import Future

        done: Future[Any] = Future()
        try:
            done.set_result(fn(*args))
        except Exception as exc:  # noqa: BLE001 - raised where the result is asked for, as a pool's
            done.set_exception(exc)
        return done


class S3Bench:
    """The server, the epochs and one fresh prefix per run; `run(variant)` runs one checked
    variant over every epoch."""

    def __init__(self, epochs: list[pa.Table], batch_rows: int) -> None:
        from pyarrow import fs

        from tests.support.s3_target import s3_sink_config

        self.endpoint = up(["s3"]).s3.endpoint()
        self.bucket = self.endpoint.bucket
        self.epochs = epochs
        self.batch_rows = batch_rows
        self.connection = s3_sink_config(self.endpoint, f"s3://{self.bucket}/bench").connection
        self.client = self.connection.client()
        self.fs = fs.S3FileSystem(**self.connection.arrow_settings())
        self.expected = sum(e.num_rows for e in epochs)
        self.id_sum = sum(int(pc.sum(e.column("id")).as_py()) for e in epochs)

    def batches(self, epoch: pa.Table) -> list[pa.RecordBatch]:
        """An epoch as a writer receives it (Spark hands over 10,000-row batches)."""
        return list(epoch.to_batches(self.batch_rows))

    def run(self, variant: str) -> S3Run:
        prefix = f"bench-s3-{variant}-{uuid.uuid4().hex[:8]}"
        if variant.startswith("ours"):
            run = self.ours(prefix, variant)
        else:
            write = {
                "write_table": self.write_table,
                "write_dataset": self.write_dataset,
                "floor-put": self.floor_put,
                "floor-multipart": self.floor_multipart,
            }[variant]
            times = []
            for n, epoch in enumerate(self.epochs):
                batches = self.batches(epoch)
                started = time.perf_counter()
                write(f"{prefix}/{n:05d}", batches)
                times.append(time.perf_counter() - started)
            run = S3Run(sum(times), [t * 1e3 for t in times])
            run.row_groups = self.check_objects(prefix, variant)
        self.delete(prefix)
        return run

    # -- ours --------------------------------------------------------------------------------
    def ours(self, prefix: str, variant: str) -> S3Run:
        import durable_sinks.core.content as content
        import durable_sinks.sinks.s3.writer as upload
        from durable_sinks.sinks.s3 import S3Sink
        from tests.support.s3_target import s3_sink_config

        before = variant == "ours-before"
        options = {"row_group_rows": self.batch_rows} if before else {}
        config = s3_sink_config(self.endpoint, f"s3://{self.bucket}/{prefix}", **options)
        store = Path(tempfile.mkdtemp(prefix="ds-bench-s3-"))
        pool, hashing = upload._pool, content._hashing
        if before:
            upload._pool = lambda: _Inline()  # type: ignore[assignment,return-value]
        if variant in ("ours-before", "ours-inline-tally"):
            content._hashing = lambda: _Inline()  # type: ignore[assignment,return-value]
        try:
            coordinator = Coordinator(
                f"bench-s3-{prefix}",
                [S3Sink(config)],
                LocalDirectoryStore(store),
                background_commits=variant == "ours-background",
            )
            coordinator.start()
            times: list[float] = []
            phases: dict[str, list[float]] = {}
            for n, epoch in enumerate(self.epochs):
                batches = self.batches(epoch)
                started = time.perf_counter()
                result = coordinator.run_epoch(n, batches)
                times.append(time.perf_counter() - started)
                for phase, seconds in result.metrics.seconds.items():
                    phases.setdefault(phase, []).append(seconds * 1e3)
            # The run ends when every epoch is visible: with background_commits, when close()
            # has waited for the last epoch's phase 2 (counted in the last epoch's time).
            started = time.perf_counter()
            coordinator.close()
            times[-1] += time.perf_counter() - started
        finally:
            upload._pool, content._hashing = pool, hashing
            shutil.rmtree(store, ignore_errors=True)
        run = S3Run(sum(times), [t * 1e3 for t in times], phases)
        run.row_groups = self.check_ours(prefix)
        return run

    def check_ours(self, prefix: str) -> int:
        """Every epoch committed (its marker), exactly the input's rows read through the
        markers, no upload left incomplete; the row groups of epoch 0's object."""
        from durable_sinks.sinks.s3 import committed_dataset, committed_markers
        from tests.support.s3_objects import incomplete_uploads

        path = f"s3://{self.bucket}/{prefix}"
        markers = committed_markers(path, self.connection)
        if [m.epoch for m in markers] != list(range(len(self.epochs))):
            raise RuntimeError(f"{path}: markers of epochs {[m.epoch for m in markers]}")
        left = incomplete_uploads(self.client, self.bucket, f"{prefix}/")
        if left:
            raise RuntimeError(f"{path}: {len(left)} uploads left incomplete")
        table = committed_dataset(path, self.connection).to_table(columns=["id"])
        self.check_ids(table.column("id"), f"ours at {path}")
        first = self.client.list_objects_v2(Bucket=self.bucket, Prefix=f"{prefix}/epoch=")
        key = min(o["Key"] for o in first.get("Contents", []))
        return self.row_groups(key)

    def row_groups(self, key: str) -> int:
        with self.fs.open_input_file(f"{self.bucket}/{key}") as file:
            return int(pq.ParquetFile(file).num_row_groups)

    # -- the peers and the floors --------------------------------------------------------------
    def write_table(self, key: str, batches: list[pa.RecordBatch]) -> None:
        table = pa.Table.from_batches(batches)
        pq.write_table(table, f"{self.bucket}/{key}.parquet", filesystem=self.fs, compression=CODEC)

    def write_dataset(self, key: str, batches: list[pa.RecordBatch]) -> None:
        import pyarrow.dataset as ds

        table = pa.Table.from_batches(batches)
        ds.write_dataset(
            table,
            f"{self.bucket}/{key}",
            format="parquet",
            filesystem=self.fs,
            file_options=ds.ParquetFileFormat().make_write_options(compression=CODEC),
            basename_template="part-{i}.parquet",
            use_threads=False,  # one file per epoch: keep the batches' order
        )

    def floor_put(self, key: str, batches: list[pa.RecordBatch]) -> None:
        body = _parquet_bytes(pa.Table.from_batches(batches))
        self.client.put_object(Bucket=self.bucket, Key=f"{key}.parquet", Body=body)

    def floor_multipart(self, key: str, batches: list[pa.RecordBatch]) -> None:
        body = _parquet_bytes(pa.Table.from_batches(batches))
        _raw_upload(self.client, self.bucket, f"{key}.parquet", body, 8 * 1024 * 1024)

    def check_objects(self, prefix: str, variant: str) -> int:
        """Exactly the input's rows in the variant's objects; the row groups of the first."""
        keys = sorted(
            o["Key"]
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=f"{prefix}/"
            )
            for o in page.get("Contents", [])
            if not o["Key"].endswith("/")  # pyarrow's folder markers
        )
        if len(keys) != len(self.epochs):
            raise RuntimeError(f"{variant}: {len(keys)} objects for {len(self.epochs)} epochs")
        ids = [
            pq.read_table(f"{self.bucket}/{k}", filesystem=self.fs, columns=["id"]).column("id")
            for k in keys
        ]
        self.check_ids(pa.chunked_array([c for i in ids for c in i.chunks]), variant)
        return self.row_groups(keys[0])

    def check_ids(self, ids: pa.ChunkedArray, what: str) -> None:
        distinct = int(pc.count_distinct(ids).as_py())
        total = int(pc.sum(ids).as_py())
        if len(ids) != self.expected or distinct != self.expected or total != self.id_sum:
            raise RuntimeError(
                f"{what}: {len(ids)} rows, {distinct} distinct ids, id sum {total}; "
                f"{self.expected} rows written, id sum {self.id_sum}"
            )

    def delete(self, prefix: str) -> None:
        from tests.support.s3_objects import delete_prefix

        delete_prefix(self.client, self.bucket, f"{prefix}/")


def s3_section(args: argparse.Namespace) -> None:
    """Ours (coordinator + S3 sink + local-directory store, fsync on) against what a user
    would write instead (pyarrow's `pq.write_table` and `dataset.write_dataset` through its
    S3FileSystem) and the floor (encoding + one raw upload), the same epochs on the test
    bed's SeaweedFS, alternating in each round."""
    variants = [v for v in args.s3_variants.split(",") if v]
    unknown = [v for v in variants if v not in S3_VARIANTS]
    if unknown or "ours" not in variants or "write_table" not in variants:
        raise SystemExit(f"--s3-variants: of {', '.join(S3_VARIANTS)}, with ours and write_table")
    rows, epoch_rows = args.batches * args.rows_per_batch, args.rows_per_batch
    table = make_events(rows)
    epochs = [table.slice(start, epoch_rows) for start in range(0, rows, epoch_rows)]
    encoded = sum(len(_parquet_bytes(e)) for e in epochs)
    bench = S3Bench(epochs, 10_000)
    print(
        f"\n## S3: {rows:,} rows (id bigint, ts timestamp, user text, amount float8, payload "
        f"text ~80 B), {len(epochs)} epochs of {epoch_rows:,} handed over as 10,000-row "
        f"batches, {encoded / 1e6:.1f} MB of zstd Parquet (one row group per epoch); "
        f"{args.rounds} rounds, the variants' order rotating each round; uptime: "
        f"{_uptime()}",
        flush=True,
    )
    for variant in variants:  # warm-up: clients, connections, the store's folders
        bench.run(variant)
    runs: dict[str, list[S3Run]] = {v: [] for v in variants}
    for round_ in range(args.rounds):
        order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
        for variant in order:
            run = bench.run(variant)
            runs[variant].append(run)
            print(
                f"round {round_ + 1} {variant:16s} {run.seconds:6.3f} s  per epoch median "
                f"{statistics.median(run.epoch_ms):5.1f} ms",
                flush=True,
            )
    print(f"uptime after: {_uptime()}")
    report_s3(runs, args)
    if args.profile:
        report_s3_pieces(bench, args.profile)
    chart = chart_path(args, "s3")
    if chart is not None:
        chart_s3(runs, args, chart)


def _uptime() -> str:
    with open("/proc/loadavg") as loadavg:
        return "load average " + ", ".join(loadavg.read().split()[:3])


def _per_epoch(done: list[S3Run]) -> float:
    return float(statistics.median(ms for r in done for ms in r.epoch_ms))


def _s3_ratio(baseline: list[S3Run], ours: list[S3Run]) -> tuple[float, float]:
    """Baseline's time / ours (> 1: ours faster): of the per-epoch medians, and the median
    of the rounds' ratios of whole runs."""
    pooled = _per_epoch(baseline) / _per_epoch(ours)
    rounds = statistics.median(b.seconds / o.seconds for b, o in zip(baseline, ours, strict=True))
    return pooled, rounds


def _floor(runs: dict[str, list[S3Run]]) -> str | None:
    """The faster floor run."""
    floors = [v for v in S3_FLOORS if v in runs]
    return min(floors, key=lambda v: _per_epoch(runs[v])) if floors else None


def report_s3(runs: dict[str, list[S3Run]], args: argparse.Namespace) -> None:
    floor = _floor(runs)
    print(
        "\nper-epoch medians over every round's epochs; ratios = the other's time / ours "
        "(> 1: ours faster), of the per-epoch medians (median of the rounds' ratios of whole "
        "runs)"
    )
    print("\n| variant | per epoch | whole run (median) | row groups | vs ours | runs (s) |")
    print("|---|---|---|---|---|---|")
    for variant, done in runs.items():
        pooled, rounds = _s3_ratio(done, runs["ours"])
        print(
            f"| {S3_VARIANTS[variant]} | {_per_epoch(done):.1f} ms "
            f"| {statistics.median(r.seconds for r in done):.3f} s | {done[0].row_groups} "
            f"| {pooled:.2f}x ({rounds:.2f}x) | {', '.join(f'{r.seconds:.3f}' for r in done)} |"
        )
    print()
    for peer in (v for v in S3_PEERS if v in runs):
        pooled, rounds = _s3_ratio(runs[peer], runs["ours"])
        print(f"ours vs {S3_VARIANTS[peer]}: {pooled:.2f}x ({rounds:.2f}x per round); goal >= 1x")
    if floor is not None:
        pooled, rounds = _s3_ratio(runs[floor], runs["ours"])
        print(
            f"ours vs the floor ({S3_VARIANTS[floor]}, the faster): ours takes "
            f"{1 / pooled:.2f}x its time ({1 / rounds:.2f}x per round); goal <= 1.25x"
        )
    print("\nours per epoch, the coordinator's phases (medians, ms):")
    phases = runs["ours"][0].phases
    print("\n| phase | " + " | ".join(phases) + " |")
    print("|---|" + "---|" * len(phases))
    for variant in (v for v in runs if v.startswith("ours")):
        cells = [
            statistics.median(ms for r in runs[variant] for ms in r.phases.get(p, [0.0]))
            for p in phases
        ]
        print(f"| {variant} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")


def report_s3_pieces(bench: S3Bench, repeats: int) -> None:
    """Each piece of an epoch's work alone, `repeats` times on epoch 0: what the variants'
    times are made of."""
    epoch = bench.epochs[0]
    batches = bench.batches(epoch)
    body = _parquet_bytes(pa.Table.from_batches(batches))
    client, bucket = bench.client, bench.bucket
    prefix = f"bench-s3-pieces-{uuid.uuid4().hex[:8]}"
    pieces: dict[str, list[float]] = {}

    def timed(name: str, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        value = step(*args, **kwargs)
        pieces.setdefault(name, []).append((time.perf_counter() - started) * 1e3)
        return value

    for n in range(repeats):
        key = f"{prefix}/{n}.parquet"
        timed("encode, one row group (as write_table)", _parquet_bytes, epoch)
        timed("encode, 10,000-row row groups (ours before)", _parquet_bytes, epoch, 10_000)
        timed("SHA-256 of the object", lambda: hashlib.sha256(body).digest())
        timed("the replay check's row hashes of the epoch", summarise, batches)
        timed("PUT of the object", client.put_object, Bucket=bucket, Key=key, Body=body)
        upload = timed(
            "CreateMultipartUpload", client.create_multipart_upload, Bucket=bucket, Key=key + "-mp"
        )["UploadId"]
        etag = timed(
            "UploadPart of the object",
            client.upload_part,
            Bucket=bucket,
            Key=key + "-mp",
            UploadId=upload,
            PartNumber=1,
            Body=body,
        )["ETag"]
        timed(
            "CompleteMultipartUpload (If-None-Match)",
            client.complete_multipart_upload,
            Bucket=bucket,
            Key=key + "-mp",
            UploadId=upload,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
            IfNoneMatch="*",
        )
        timed(
            "PUT of a 1 KB marker (If-None-Match)",
            client.put_object,
            Bucket=bucket,
            Key=key + ".json",
            Body=b"{}" * 512,
            IfNoneMatch="*",
        )
    bench.delete(prefix)
    print(f"\nthe pieces of one epoch alone (epoch 0, {len(body) / 1e6:.2f} MB; {repeats} times):")
    print("\n| piece | median ms | min ms |\n|---|---|---|")
    for name, ms in pieces.items():
        print(f"| {name} | {statistics.median(ms):.1f} | {min(ms):.1f} |")


def chart_s3(runs: dict[str, list[S3Run]], args: argparse.Namespace, path: Path) -> None:
    """pq.write_table's time / each variant's (higher is faster), per epoch."""
    from benchmarks.charts import RATIO, bar_chart

    peer = runs["write_table"]
    floor = _floor(runs)
    bars = [
        (S3_VARIANTS[v], _s3_ratio(peer, runs[v])[0])
        for v in runs
        if v != "write_table" and (v not in S3_FLOORS or v == floor)
    ]
    references = [("pq.write_table = 1x = goal", 1.0)]
    if floor is not None:
        references.append(("1.25x the floor's time", _s3_ratio(peer, runs[floor])[0] / 1.25))
    written = bar_chart(
        path,
        f"S3 sink vs pyarrow's S3 writes: {len(runs['ours'][0].epoch_ms)} epochs of "
        f"{args.rows_per_batch:,} rows, zstd, {args.rounds} rounds\n"
        "pq.write_table's time / each one's, per-epoch medians (higher is faster)",
        bars,
        "x (pq.write_table's time / the variant's)",
        highlight=[S3_VARIANTS["ours"]],
        references=references,
        value_format=RATIO,
    )
    print(f"chart: {written}")


def _parquet_bytes(table: pa.Table, row_group_rows: int | None = None) -> bytes:
    """The table as zstd Parquet, as `pq.write_table` encodes it (one row group up to pyarrow's
    1,048,576 rows), or in row groups of `row_group_rows`."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=CODEC, row_group_size=row_group_rows)
    return bytes(sink.getvalue())


def _raw_upload(client: Any, bucket: str, key: str, body: bytes, part_size: int) -> None:
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = []
    for number, start in enumerate(range(0, len(body), part_size), 1):
        answer = client.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=upload,
            PartNumber=number,
            Body=body[start : start + part_size],
        )
        parts.append({"PartNumber": number, "ETag": answer["ETag"]})
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only",
        choices=("files", "s3", "all"),
        default="files",
        help="which section to run",
    )
    parser.add_argument("--rows-per-batch", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=10, help="micro-batches")
    parser.add_argument(
        "--files-per-batch",
        type=int,
        default=2,
        help="input files per micro-batch (maxFilesPerTrigger); Spark reads each file of this "
        "size as one split, one task",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--settle", type=float, default=1.0, help="seconds of rest before a run")
    parser.add_argument("--timeout", type=float, default=600.0, help="per query, seconds")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated, in the order run each round; of {', '.join(FILE_VARIANTS)}",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=10,
        metavar="N",
        help="repeats of the outside-Spark split of our batch (0: skip it)",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=10_000,
        help="with --profile: epochs already published when an executor-mode task opens the "
        "files sink (0: skip it)",
    )
    parser.add_argument(
        "--s3-variants",
        default=",".join(S3_DEFAULT_VARIANTS),
        help=f"the S3 section's, in the order of the first round; of {', '.join(S3_VARIANTS)}",
    )
    parser.add_argument(
        "--chart",
        type=Path,
        help="also draw the ratio table into this PNG (with --only all: one per section, "
        "named <stem>-files and <stem>-s3)",
    )
    args = parser.parse_args()
    if args.rows_per_batch % args.files_per_batch:
        parser.error("--rows-per-batch must be a multiple of --files-per-batch")
    if args.only in ("files", "all"):
        files_section(args)
    if args.only in ("s3", "all"):
        s3_section(args)


if __name__ == "__main__":
    main()
