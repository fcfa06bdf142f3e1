"""The Kafka sink in exactly-once mode vs a plain idempotent, non-transactional producer.

    .venv/bin/python -m benchmarks.kafka_sink [--records 1000000] [--epoch-records 100000]
        [--rounds 6] [--small-epochs 300] [--chart PNG]

Needs the test bed's Kafka (`python -m tests.services up kafka`). The same records (a 16-byte
key and a 200-byte value each, plus the `ds-epoch` header) go to a fresh two-partition topic:
- baseline: one `Producer` with `enable.idempotence=true`, `acks=all` and the sink's own
  throughput settings, fed from ready-made Python bytes (no Arrow conversion), flushed after
  every `--epoch-records` records as an epoch would be;
- ours: Arrow record batches through the coordinator into `KafkaSink` (value_column, key_column),
  one Kafka transaction per epoch with its progress record, the commit point, and the wait until
  read_committed readers see the epoch.
Baseline and ours alternate (ABBA) for `--rounds` rounds into fresh topics, each after
`--settle` seconds of rest; best and median of each are reported.
Then the per-epoch commit latency (pre_commit flush + progress record + commit_transaction +
visibility wait) over the large epochs and over many small ones.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from durable_sinks.coordinator import Coordinator
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.kafka.admin import list_offsets
from durable_sinks.sinks.kafka.config import THROUGHPUT_DEFAULTS
from tests.services import Testbed
from tests.support.targets import create_topic

VALUE_BYTES = 200
PARTITIONS = 2


def make_records(count: int) -> pa.Table:
    keys = [f"key-{i:012d}" for i in range(count)]
    body = bytes(range(256)) * 2
    values = [(b"%012d" % i) + body[i % 200 : i % 200 + VALUE_BYTES - 12] for i in range(count)]
    return pa.table({"key": pa.array(keys), "value": pa.array(values, pa.binary())})


def baseline(
    bootstrap: str, topic: str, records: pa.Table, epoch_records: int, *, from_arrow: bool
) -> float:
    """A plain idempotent producer. `from_arrow`: each epoch's keys and values are taken from
    the Arrow table inside the timed loop (what any writer of Arrow rows must do); otherwise
    they are Python bytes made before the clock starts (the bare produce loop)."""
    ready: tuple[list[Any], list[Any]] | None = None
    if not from_arrow:
        ready = (records.column("key").to_pylist(), records.column("value").to_pylist())
    producer = Producer(
        {
            **THROUGHPUT_DEFAULTS,
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "delivery.report.only.error": True,
            "on_delivery": _fail_on_error,
        }
    )
    producer.list_topics(topic, timeout=10)  # connected before the clock starts, as ours is
    started = time.perf_counter()
    produce, poll = producer.produce, producer.poll
    for epoch, offset in enumerate(range(0, records.num_rows, epoch_records)):
        headers: list[tuple[str, str | bytes | None]] = [("ds-epoch", str(epoch).encode())]
        if ready is None:
            chunk = records.slice(offset, epoch_records)
            keys, values = chunk.column("key").to_pylist(), chunk.column("value").to_pylist()
        else:
            keys = ready[0][offset : offset + epoch_records]
            values = ready[1][offset : offset + epoch_records]
        for key, value in zip(keys, values, strict=True):
            try:
                produce(topic, value, key, headers=headers)
            except BufferError:
                poll(0.05)
                produce(topic, value, key, headers=headers)
        poll(0)
        assert producer.flush(60) == 0
    return time.perf_counter() - started


def _fail_on_error(error: Any, message: Any) -> None:
    if error is not None:
        raise RuntimeError(f"baseline delivery failed: {error}")


def ours(
    bootstrap: str, topic: str, records: pa.Table, epoch_records: int, store: Path
) -> tuple[float, list[float], dict[str, float]]:
    sink = KafkaSink(  # with the header the baseline sends too: the same records on both sides
        Kafka(
            bootstrap,
            topic,
            value_column="value",
            key_column="key",
            name="bench",
            epoch_header=True,
        )
    )
    coordinator = Coordinator(f"bench-{uuid.uuid4().hex[:8]}", [sink], LocalDirectoryStore(store))
    coordinator.start()
    protocol: list[float] = []
    phases: dict[str, float] = {}
    started = time.perf_counter()
    for epoch, offset in enumerate(range(0, records.num_rows, epoch_records)):
        chunk = records.slice(offset, epoch_records)
        result = coordinator.run_epoch(epoch, chunk.to_batches(max_chunksize=epoch_records))
        protocol.append(result.metrics.protocol_seconds)
        for phase, seconds in result.metrics.seconds.items():
            phases[phase] = phases.get(phase, 0.0) + seconds
    elapsed = time.perf_counter() - started
    coordinator.close()
    return elapsed, protocol, phases


def committed(admin: AdminClient, topic: str) -> int:
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    return sum(list_offsets(admin, partitions, IsolationLevel.READ_COMMITTED, 30).values())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--epoch-records", type=int, default=100_000)
    parser.add_argument("--small-epochs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds of rest before a run")
    parser.add_argument("--chart", type=Path, help="also draw the ratios into this PNG")
    args = parser.parse_args()
    bootstrap = Testbed.create().kafka.endpoint().bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    work = Path(tempfile.mkdtemp(prefix="ds-kafka-bench-"))
    records = make_records(args.records)
    topics: list[str] = []

    def fresh_topic() -> str:
        name = f"bench-{uuid.uuid4().hex[:10]}"
        create_topic(admin, name, PARTITIONS)
        topics.extend([name, f"{name}-ds-progress"])
        return name

    names = ("baseline", "produce-only", "ours")
    times: dict[str, list[float]] = {name: [] for name in names}
    protocol: list[float] = []
    phases: list[dict[str, float]] = []
    try:
        for round_ in range(args.rounds):
            # The order rotates: whichever runs after another shares the broker with the
            # other's log flush.
            for name in names[round_ % 3 :] + names[: round_ % 3]:
                topic = fresh_topic()
                time.sleep(args.settle)
                if name != "ours":
                    times[name].append(
                        baseline(
                            bootstrap,
                            topic,
                            records,
                            args.epoch_records,
                            from_arrow=name == "baseline",
                        )
                    )
                    continue
                elapsed, epoch_protocol, spent = ours(
                    bootstrap, topic, records, args.epoch_records, work / f"store-{round_}"
                )
                assert committed(admin, topic) >= args.records  # records + commit markers
                times[name].append(elapsed)
                protocol += epoch_protocol
                phases.append(spent)
        small = make_records(args.small_epochs * 100)
        _, small_protocol, _ = ours(bootstrap, fresh_topic(), small, 100, work / "store-small")
    finally:
        existing = set(admin.list_topics(timeout=30).topics)
        doomed = [t for t in topics if t in existing]
        if doomed:
            for future in admin.delete_topics(doomed, request_timeout=30).values():
                future.result(timeout=30)

    best = {name: min(runs) for name, runs in times.items()}
    epochs = -(-args.records // args.epoch_records)
    megabytes = args.records * (VALUE_BYTES + 16) / 1e6
    print(
        f"{args.records:,} records of {VALUE_BYTES} bytes (+16-byte key, ds-epoch header), "
        f"{megabytes:.0f} MB; epochs of {args.epoch_records:,}; {PARTITIONS} partitions; "
        f"best of {args.rounds} rounds"
    )
    labels = {
        "baseline": "idempotent producer from Arrow",
        "produce-only": "idempotent producer, bytes ready",
        "ours": "ours, exactly-once",
    }
    for name, runs in times.items():
        print(
            f"{labels[name]:34s} best {best[name]:.2f} s ({args.records / best[name]:,.0f} "
            f"records/s)  runs {', '.join(f'{t:.2f}' for t in runs)}"
        )
    middle = {name: statistics.median(runs) for name, runs in times.items()}
    for name in ("baseline", "produce-only"):
        print(
            f"ratio ours / {labels[name]} (throughput): best {best[name] / best['ours']:.2f}x, "
            f"median {middle[name] / middle['ours']:.2f}x"
        )
    if args.chart is not None:
        chart(args, times, labels)
    spent = phases[times["ours"].index(best["ours"])]
    print(
        "ours, best round by phase: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in spent.items() if v)
        + f" over {epochs} epochs"
    )
    print(
        f"commit latency per {args.epoch_records:,}-record epoch (pre_commit + decision + "
        f"commit, {len(protocol)} epochs): p50 {statistics.median(protocol) * 1e3:.1f} ms, "
        f"p99 {percentile(protocol, 0.99) * 1e3:.1f} ms"
    )
    print(
        f"commit latency per 100-record epoch ({args.small_epochs} epochs): "
        f"p50 {statistics.median(small_protocol) * 1e3:.1f} ms, "
        f"p99 {percentile(small_protocol, 0.99) * 1e3:.1f} ms"
    )


def chart(args: argparse.Namespace, times: dict[str, list[float]], labels: dict[str, str]) -> None:
    """Ours' throughput as a multiple of each plain producer's: best to best, median to
    median."""
    from benchmarks.charts import RATIO, grouped_bar_chart

    others = ("baseline", "produce-only")
    written = grouped_bar_chart(
        args.chart,
        f"Kafka sink, exactly-once, vs a plain idempotent producer: {args.records:,} records, "
        f"epochs of {args.epoch_records:,}, {args.rounds} rounds\n"
        "ours' throughput / the producer's (higher is better)",
        [f"ours / {labels[name]}" for name in others],
        [
            ("best / best", [min(times[name]) / min(times["ours"]) for name in others]),
            (
                "median / median",
                [
                    statistics.median(times[name]) / statistics.median(times["ours"])
                    for name in others
                ],
            ),
        ],
        "x the plain producer's throughput",
        references=[("producer = 1x", 1.0), ("goal 0.9x", 0.9)],
        value_format=RATIO,
    )
    print(f"chart: {written}")


if __name__ == "__main__":
    main()
