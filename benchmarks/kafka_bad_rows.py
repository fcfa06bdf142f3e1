"""What bad-row handling costs the Kafka sink, at the coordinator (no Spark).

    .venv/bin/python -m benchmarks.kafka_bad_rows [--epoch-records 100000] [--pairs 15]
        [--oversize 0.01] [--chart PNG]

Needs the test bed's Kafka (`python -m tests.services up kafka`). Each epoch is
`--epoch-records` records (a 16-byte key, a 200-byte value, the `ds-epoch` header) through
the coordinator into `KafkaSink` (value_column, key_column), one Kafka transaction per epoch,
into a two-partition topic whose max.message.bytes is 16,384 (the producer's batches stay
below it). Three jobs, each with a topic of its own:
- clean, fail: on_bad_rows="fail" (the default), no bad row;
- clean, dead letter: on_bad_rows="dead_letter" with a files dead-letter sink, no bad row (the
  checks run, nothing is refused: the dead-letter sink takes no part);
- oversize, dead letter: the same with `--oversize` of the rows 20,000 bytes long: refused
  before anything is produced (RECORD_TOO_LARGE) and written to the dead letter, a second
  participant of the epoch;
- misrouted, dead letter: the same share of the rows, of the usual size, naming a partition
  the topic does not have (INVALID_VALUE): bad rows that do not double the epoch's bytes.
Three comparisons, each `--pairs` rounds after a warm-up epoch of each job: in a round the two
jobs each run one epoch, back to back (which goes first alternates), so both see the same
moment of a shared machine. Reported: the median epoch of each job and the median of the
rounds' ratios, against the goals: clean dead letter <= 1.03x clean fail, bad rows <= 1.5x
clean. Then, in this process and without the broker, where an oversize epoch's extra time
goes: the sink's own part (encode, size checks, refused rows dropped, Python lists for
`produce`) for the clean and the oversize epoch, and the coordinator's dead-letter batch (one
row per refused row, the whole row as JSON).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
from confluent_kafka.admin import AdminClient

from durable_sinks.coordinator import Coordinator
from durable_sinks.coordinator._dead_letters import DeadLetterPass
from durable_sinks.core.bad_rows import BadRowCap, BadRowPolicy, WritePolicy
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.kafka.admin import TopicFacts
from durable_sinks.sinks.kafka.records import RecordLayout, encode_records
from tests.services import Testbed
from tests.support.targets import create_topic

VALUE_BYTES = 200
OVERSIZE_BYTES = 20_000
TOPIC_LIMIT = 16_384
PARTITIONS = 2


def make_epoch(count: int, oversize: float, misrouted: float = 0.0) -> pa.RecordBatch:
    """`count` records; every round(1 / oversize)-th one OVERSIZE_BYTES long, every
    round(1 / misrouted)-th one naming a partition the topic does not have (none at 0); the
    others name none (the partitioner's choice)."""
    every = round(1 / oversize) if oversize > 0 else 0
    astray = round(1 / misrouted) if misrouted > 0 else 0
    body = bytes(range(256)) * (OVERSIZE_BYTES // 256 + 1)
    keys = [f"key-{i:012d}" for i in range(count)]
    values = [
        (b"%012d" % i)
        + body[: (OVERSIZE_BYTES if every and i % every == every - 1 else VALUE_BYTES) - 12]
        for i in range(count)
    ]
    partitions = [PARTITIONS if astray and i % astray == astray - 1 else None for i in range(count)]
    return pa.record_batch(
        {
            "key": pa.array(keys),
            "value": pa.array(values, pa.binary()),
            "partition": pa.array(partitions, pa.int32()),
        }
    )


class Job:
    """One benchmark job: a coordinator writing `batch` as each of its epochs."""

    def __init__(
        self, bootstrap: str, topic: str, batch: pa.RecordBatch, work: Path, *, isolating: bool
    ) -> None:
        sink = KafkaSink(
            Kafka(
                bootstrap,
                topic,
                value_column="value",
                key_column="key",
                partition_column="partition",
                name="k",
            )
        )
        self.batch = batch
        self.epoch = 0
        self.coordinator = Coordinator(
            f"bench-{uuid.uuid4().hex[:8]}",
            [sink],
            LocalDirectoryStore(work / "store"),
            policy=WritePolicy(on_bad_rows=BadRowPolicy.DEAD_LETTER) if isolating else None,
            dead_letter=FolderSink(Files(str(work / "dead"), name="dead")) if isolating else None,
            bad_row_cap=BadRowCap(0.05),
        )
        self.coordinator.start()

    def run(self) -> float:
        """Seconds of the next epoch."""
        started = time.perf_counter()
        self.coordinator.run_epoch(self.epoch, [self.batch])
        self.epoch += 1
        return time.perf_counter() - started


def paired(first: Job, second: Job, pairs: int) -> tuple[list[float], list[float]]:
    """Each job's epoch seconds over `pairs` rounds (after a warm-up epoch of each)."""
    first.run()
    second.run()
    times: tuple[list[float], list[float]] = ([], [])
    for round_ in range(pairs):
        if round_ % 2:
            times[1].append(second.run())
            times[0].append(first.run())
        else:
            times[0].append(first.run())
            times[1].append(second.run())
    return times


def report(name: str, base: str, times: tuple[list[float], list[float]], goal: float) -> float:
    """Print the comparison; the median of the rounds' ratios."""
    ratios = [b / a for a, b in zip(*times, strict=True)]
    print(
        f"{name} / {base}: median of the rounds' ratios {statistics.median(ratios):.3f}x "
        f"(goal <= {goal}x; ratios {min(ratios):.2f}-{max(ratios):.2f}); medians "
        f"{statistics.median(times[1]) * 1e3:.1f} vs {statistics.median(times[0]) * 1e3:.1f} "
        "ms per epoch"
    )
    return statistics.median(ratios)


def chart(path: Path, args: argparse.Namespace, ratios: list[float]) -> None:
    from benchmarks.charts import RATIO, grouped_bar_chart

    written = grouped_bar_chart(
        path,
        f"Kafka sink, bad rows: epochs of {args.epoch_records:,} records, {args.pairs} paired "
        "rounds per comparison\nmedian of the rounds' epoch-time ratios (lower is better)",
        [
            "clean, on_bad_rows='dead_letter' / clean, 'fail' (goal <= 1.03x)",
            f"{args.oversize:.0%} oversize rows to the dead letter / clean (goal <= 1.5x)",
            f"{args.oversize:.0%} misrouted rows to the dead letter / clean (goal <= 1.5x)",
        ],
        [("median ratio", ratios)],
        "x the other job's epoch time",
        references=[("same = 1x", 1.0), ("goal 1.5x", 1.5)],
        value_format=RATIO,
    )
    print(f"chart: {written}")


def breakdown(clean: pa.RecordBatch, bad: pa.RecordBatch, repeats: int = 7) -> None:
    """Median ms of the sink's own part per epoch, clean and oversize, and of the dead-letter
    batch of the oversize epoch."""
    sink = KafkaSink(Kafka("127.0.0.1:9", "t", value_column="value", key_column="key", name="k"))
    facts = TopicFacts(PARTITIONS, TOPIC_LIMIT)
    layout = RecordLayout("value", "key", partition_column="partition")
    parts: dict[str, list[float]] = {"clean": [], "oversize": [], "dead letters": []}
    for _ in range(repeats):
        for name, batch in (("clean", clean), ("oversize", bad)):
            started = time.perf_counter()
            encoded = encode_records(batch, layout)
            refused = sink._size_refusals(encoded, "t", facts)
            if refused:
                encoded = encoded.kept(refused.kept_mask(len(encoded)))
                batch.filter(refused.kept_mask(batch.num_rows))  # what _refuse returns
            encoded.records(0)
            parts[name].append(time.perf_counter() - started)
            if refused:
                started = time.perf_counter()
                letters = DeadLetterPass("bench", 0, BadRowCap(0.05), isolating=True)
                letters.read(0, batch)
                letters.add("bench", 0, batch, refused)
                letters.batch()
                parts["dead letters"].append(time.perf_counter() - started)
    print(
        "in-process, medians: the sink's part (encode, checks, drop refused rows, lists): "
        f"clean {statistics.median(parts['clean']) * 1e3:.1f} ms, oversize "
        f"{statistics.median(parts['oversize']) * 1e3:.1f} ms; the dead-letter batch of the "
        f"oversize epoch {statistics.median(parts['dead letters']) * 1e3:.1f} ms; epoch bytes: "
        f"clean {clean.nbytes / 1e6:.0f} MB, oversize {bad.nbytes / 1e6:.0f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epoch-records", type=int, default=100_000)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--oversize", type=float, default=0.01)
    parser.add_argument("--chart", type=Path, help="also draw the ratios into this PNG")
    args = parser.parse_args()
    bootstrap = Testbed.create().kafka.endpoint().bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    work = Path(tempfile.mkdtemp(prefix="ds-kafka-bad-rows-"))
    clean = make_epoch(args.epoch_records, 0)
    bad = make_epoch(args.epoch_records, args.oversize)
    topics: list[str] = []
    jobs: list[Job] = []

    def job(batch: pa.RecordBatch, *, isolating: bool) -> Job:
        topic = f"bench-{uuid.uuid4().hex[:10]}"
        create_topic(admin, topic, PARTITIONS, **{"max.message.bytes": str(TOPIC_LIMIT)})
        topics.extend([topic, f"{topic}-ds-progress"])
        jobs.append(Job(bootstrap, topic, batch, work / topic, isolating=isolating))
        return jobs[-1]

    try:
        failing = job(clean, isolating=False)
        isolating = job(clean, isolating=True)
        oversize = job(bad, isolating=True)
        misrouted = job(make_epoch(args.epoch_records, 0, args.oversize), isolating=True)
        print(
            f"epochs of {args.epoch_records:,} records ({VALUE_BYTES}-byte values, 16-byte "
            f"keys); oversize: {args.oversize:.0%} of them {OVERSIZE_BYTES:,} bytes (topic "
            f"limit {TOPIC_LIMIT:,}); {args.pairs} rounds per comparison"
        )
        ratios = [
            report(
                "clean, dead letter", "clean, fail", paired(failing, isolating, args.pairs), 1.03
            ),
            report(
                "oversize, dead letter",
                "clean, dead letter",
                paired(isolating, oversize, args.pairs),
                1.5,
            ),
            report(
                "misrouted, dead letter",
                "clean, dead letter",
                paired(isolating, misrouted, args.pairs),
                1.5,
            ),
        ]
    finally:
        for made in jobs:
            made.coordinator.close()
        existing = set(admin.list_topics(timeout=30).topics)
        doomed = [t for t in topics if t in existing]
        if doomed:
            for future in admin.delete_topics(doomed, request_timeout=30).values():
                future.result(timeout=30)
    breakdown(clean, bad)
    if args.chart is not None:
        chart(args.chart, args, ratios)


if __name__ == "__main__":
    main()
