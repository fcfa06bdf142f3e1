"""How long a Kafka job takes to start, and the two librdkafka waits the sink steps around.

    .venv/bin/python -m benchmarks.kafka_startup [--rounds 5] [--chart PNG]

Needs the test bed's Kafka. Each round, on fresh topics and transactional ids:
- a transactional producer's `init_transactions` right after the producer is made, with
  librdkafka's default sparse connections vs `enable.sparse.connections=false`: sparse, the
  producer drops its bootstrap connection once it has learnt the brokers, finds no broker up
  for its transaction-coordinator query, and retries after a connection rate limit (~50 ms)
  or its coordinator-query timer (500 ms);
- a read_committed consumer made before a record is committed (as the sink's progress reader
  is: it finds the new progress topic empty, then the fence record is written), then assigned
  until its position passes the record, vs the same after `list_topics` of the topic when it
  was made: a topic it has no metadata for is looked up at librdkafka's once-a-second scan;
- `durable_sink("kafka", ...)`'s construction (validation, topics, fencing, the producer, the
  progress read), which does both the second way (sinks/kafka/config.py, progress.py);
- an open sink's producer replaced between two epochs, as a change of its transaction timeout
  does (sinks/kafka/timeouts.py): the fence and progress read, a new producer's
  `init_transactions`, the fence record written;
- the start's KIP-939 probe's ApiVersions request to a bootstrap broker (sinks/kafka/kip939.py).
Medians over the rounds, in ms.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from durable_sinks.core.protocol import OpenContext
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.kafka.config import bootstrap_hosts
from durable_sinks.sinks.kafka.kip939 import broker_api_versions
from durable_sinks.spark import durable_sink
from tests.services import up
from tests.support.targets import create_topic

BUILT = "durable_sink('kafka', ...) built"
REPLACED = "an open sink's producer replaced (a transaction timeout change)"
PROBED = "KIP-939 probe: ApiVersions to a bootstrap broker"


def timed(run: Callable[..., object], *args: object) -> float:
    started = time.perf_counter()
    run(*args)
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chart", type=Path, help="also draw the medians into this PNG")
    args = parser.parse_args()
    bootstrap = up(["kafka"]).kafka.endpoint().bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    ms: dict[str, list[float]] = {}
    as_the_sink: list[str] = []  # the steps done the sink's way (the chart's accent)

    def producer_start(sparse: bool, topic: str) -> None:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": f"bench-{uuid.uuid4()}",
                "enable.sparse.connections": sparse,
            }
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, b"v", b"k")
        producer.commit_transaction(30)

    def consumer_read(metadata_first: bool, topic: str) -> float:
        """As the sink's progress reader: the consumer made (and found nothing to read)
        before a transaction commits a record; then assigned and read up to it."""
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "bench-startup",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        if metadata_first:
            consumer.list_topics(topic, timeout=10)
        consumer.unassign()
        producer_start(False, topic)
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, 0, 0)])
        while consumer.position([TopicPartition(topic, 0)])[0].offset < 1:
            consumer.consume(num_messages=500, timeout=0.02)
        elapsed = (time.perf_counter() - started) * 1e3
        consumer.close()
        return elapsed

    for _ in range(args.rounds):
        for metadata_first in (False, True):
            topic = f"bench-startup-{uuid.uuid4().hex[:8]}"
            create_topic(admin, topic, partitions=1)
            how = "after list_topics" if metadata_first else "at once"
            sparse = "false" if metadata_first else "true (default)"
            start = f"producer: init_transactions, enable.sparse.connections={sparse}"
            start += " (+ one transaction)"
            ms.setdefault(start, []).append(timed(producer_start, not metadata_first, topic))
            read = f"consumer: assign and read a committed record, {how}"
            ms.setdefault(read, []).append(consumer_read(metadata_first, topic))
            if metadata_first and start not in as_the_sink:
                as_the_sink += [start, read]
        topic = f"bench-startup-{uuid.uuid4().hex[:8]}"
        create_topic(admin, topic, partitions=2)
        with tempfile.TemporaryDirectory() as store:
            job = f"bench-startup-{uuid.uuid4().hex[:8]}"
            started = time.perf_counter()
            writer = durable_sink(
                "kafka", bootstrap_servers=bootstrap, topic=topic, decision_store=store, job_id=job
            )
            built = (time.perf_counter() - started) * 1e3
            ms.setdefault(BUILT, []).append(built)
            writer.close()
        sink = KafkaSink(Kafka(bootstrap, topic))
        sink.open(OpenContext(f"bench-startup-{uuid.uuid4().hex[:8]}", "kafka", 1))
        try:
            ms.setdefault(REPLACED, []).append(timed(sink._start_producer, 1))
        finally:
            sink.close()
        hosts = bootstrap_hosts(bootstrap, "plaintext", "bench")
        ms.setdefault(PROBED, []).append(timed(broker_api_versions, hosts, "plaintext", 5.0))

    print(f"\nmedian of {args.rounds} rounds (ms; each round's runs in the first column)\n")
    print("| step | median | runs |")
    print("|---|---|---|")
    for step, runs in ms.items():
        print(f"| {step} | {statistics.median(runs):.0f} | {', '.join(f'{r:.0f}' for r in runs)} |")
    if args.chart is not None:
        from benchmarks.charts import bar_chart

        written = bar_chart(
            args.chart,
            f"A Kafka job's start: median of {args.rounds} rounds\n"
            "librdkafka's defaults (blue) vs what the sink does (orange)",
            [(step, statistics.median(runs)) for step, runs in ms.items()],
            "ms (lower is better)",
            highlight=[*as_the_sink, BUILT],
        )
        print(f"chart: {written}")


if __name__ == "__main__":
    main()
