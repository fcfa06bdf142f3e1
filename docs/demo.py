"""The demo behind `make demo`: orders from a Kafka topic, through a Spark streaming query,
into Postgres, S3 and Kafka together, exactly once, across a SIGKILL of the driver.

1. Starts the test bed's Postgres, Kafka, S3 and Spark (tests/services), and fills a source topic
   with ORDERS orders.
2. Runs the streaming query in a child process (Kafka source, 500 orders per batch,
   `foreachBatch(durable_sink([postgres, s3, kafka], job_id=...))`) and SIGKILLs that driver
   (Python and its JVM) right after batch KILL_EPOCH's decision: the Kafka transaction is
   committed, the Postgres participant still prepared, the S3 upload not yet completed.
3. Restarts the query from the same checkpoint: recovery commits the prepared participants,
   Spark replays the batch (already committed: skipped), the query goes on to the end.
4. Prints what landed: orders expected, rows in Postgres, rows of the committed S3 epochs
   (read through their manifests), records a read_committed consumer sees in the output
   topic, duplicates, leftovers, and each epoch's decision. Exits 1 on any duplicate
   or loss.

    python docs/demo.py            (from the repository root, after `make install`)
    python docs/demo.py --connect  (the same through Spark Connect)

With `--connect` the query runs on a Spark Connect server the demo starts from the pyspark
wheel (tests/services/connect.py, a server of its own, port DS_CONNECT_PORT + 2): the child is
a Connect client, foreachBatch runs on the server, and the process SIGKILLed at the decision
is the server (it is the driver); the demo starts it again before run 2. The per-batch lines
are then the query's progress as the client sees it, and recovery is logged on the server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ORDERS = 5_000
PER_BATCH = 500
KILL_EPOCH = 4
WORK = ROOT / ".demo"


def child(plan_path: str) -> int:
    """The streaming query (a driver that the demo may kill; with Spark Connect, a client
    whose query runs on the Connect server, the driver that the demo may kill)."""
    from pyspark.sql import SparkSession, functions

    from durable_sinks import DurableBatchWriter, sink
    from durable_sinks.spark import JobOptions
    from tests.services import Testbed

    plan = json.loads(Path(plan_path).read_text())

    class Writer(DurableBatchWriter):
        epoch = -1

        def __call__(self, df: Any, batch_id: int) -> None:
            self.epoch = batch_id
            super().__call__(df, batch_id)
            result = self.last_result
            assert result is not None
            print(f"  batch {batch_id}: {result.outcome.value}, {result.decision.rows()}")

        def _on_step(self, step: str) -> None:
            if plan["kill"] and self.epoch == KILL_EPOCH and step == "after-decision":
                print(
                    f"  batch {KILL_EPOCH}: decided, Kafka committed, Postgres and S3 prepared: "
                    "SIGKILL the driver now",
                    flush=True,
                )
                os.killpg(os.getpgid(0), signal.SIGKILL)

    remote = plan.get("connect")
    if remote:
        from tests.support.connect_client import exit_without_release, short_retries

        # The client warns once its retries are spent on the killed server; the demo says so.
        warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")
        spark = SparkSession.builder.remote(remote).getOrCreate()
        # A client retries a server that does not answer for ~10 minutes by default: give up
        # soon once the server (the driver) is killed.
        short_retries(spark)
    else:
        spark = Testbed.create().spark.session("durable-sinks-demo")
        spark.sparkContext.setLogLevel("ERROR")
    writer = Writer(
        [
            sink("postgres", dsn=plan["dsn"], table=plan["table"], create_table=True),
            sink("s3", **plan["s3"]),
            sink("kafka", bootstrap_servers=plan["kafka"], topic=plan["output"]),
        ],
        JobOptions(plan["job_id"]),
    )
    if writer.recovery is not None and (writer.recovery.committed or writer.recovery.rolled_back):
        print(f"  recovery: {writer.recovery}")
    order = "order_id LONG, customer STRING, amount DOUBLE"
    orders = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", plan["kafka"])
        .option("subscribe", plan["source"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", PER_BATCH)
        .load()
        .select(
            functions.from_json(functions.col("value").cast("string"), order).alias("o"),
            "offset",
        )
        .select("o.*", functions.col("offset").alias("source_offset"))
    )
    query = (
        orders.writeStream.foreachBatch(writer)
        .option("checkpointLocation", plan["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    if not remote:
        query.awaitTermination()
        writer.close()
        spark.stop()
        return 0
    try:
        query.awaitTermination()
    except Exception as exc:  # noqa: BLE001 - the demo reports it and exits 1
        print(f"  the query stopped: the client lost the Connect server ({type(exc).__name__})")
        exit_without_release(1)
    for progress in query.recentProgress:
        if progress.batchId == KILL_EPOCH:
            # Spark's progress counts no input rows for a batch rerun from its offset log.
            print(
                f"  batch {KILL_EPOCH}: replayed; decided before the kill, so its prepared "
                "work is committed and nothing is written twice"
            )
        else:
            print(
                f"  batch {progress.batchId}: {progress.numInputRows} rows (on the Connect server)"
            )
    spark.stop()
    return 0


def run_child(plan: dict[str, Any], name: str) -> int:
    path = WORK / f"{name}.json"
    path.write_text(json.dumps(plan))
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(path)],
        start_new_session=True,  # the kill takes the child's JVM with it
        check=False,
    )
    return proc.returncode


def connect_server() -> Any:
    """The demo's own Spark Connect server (the demo kills it: never the test bed's shared
    one), started."""
    from tests.services import Layout, SparkConnect

    layout = Layout.from_env()
    server = SparkConnect(layout, name="demo-connect", port=layout.connect.port + 2)
    server.up()
    return server


def main(connect: bool = False) -> int:
    import psycopg
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
    from psycopg import sql

    from durable_sinks.manifest import DecisionRecord
    from durable_sinks.sinks.s3 import committed_dataset
    from tests.services import up
    from tests.support.s3_objects import incomplete_uploads
    from tests.support.s3_target import s3_options, s3_sink_config

    print("starting Postgres, Kafka, S3 and Spark (first time: downloads, a few minutes)...")
    testbed = up(["postgres", "kafka", "s3", "spark"])
    server = None
    if connect:
        print("starting the demo's Spark Connect server (the driver; about 20 s)...")
        server = connect_server()
    pg, kafka, s3 = testbed.postgres.endpoint(), testbed.kafka.endpoint(), testbed.s3.endpoint()
    run = time.strftime("%Y%m%d_%H%M%S") + "_" + uuid.uuid4().hex[:4]
    WORK.mkdir(exist_ok=True)
    schema, source, output = f"demo_{run}", f"demo-orders-{run}", f"demo-orders-out-{run}"
    with psycopg.connect(pg.conninfo(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    admin = AdminClient(kafka.config())
    for future in admin.create_topics(
        [NewTopic(source, num_partitions=1), NewTopic(output, num_partitions=1)]
    ).values():
        future.result(timeout=30)
    producer = Producer(kafka.config({"enable.idempotence": True}))
    for i in range(ORDERS):
        order = {"order_id": i, "customer": f"c{i % 97}", "amount": round(i * 1.25, 2)}
        producer.produce(source, json.dumps(order).encode())
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(30)
    print(f"source topic {source}: {ORDERS} orders; {PER_BATCH} per batch")

    plan = {
        "dsn": pg.conninfo(),
        "table": f"{schema}.orders",
        "kafka": kafka.bootstrap_servers,
        "source": source,
        "output": output,
        "job_id": f"demo-{run}",
        "s3": s3_options(s3, f"s3://{s3.bucket}/demo-{run}/orders"),
        "checkpoint": str(WORK / f"checkpoint-{run}"),
        "kill": True,
        "connect": server.url if server is not None else None,
    }
    print("\nrun 1: the streaming query, killed part-way")
    code = run_child(plan, f"plan-{run}-1")
    if server is None:
        print(
            f"  driver exit status {code} ({'SIGKILL' if code == -signal.SIGKILL else 'no kill'})"
        )
    else:
        what = "was SIGKILLed" if code != 0 else "was not killed"
        print(f"  client exit status {code}: the Connect server (the driver) {what}")
        server.kill()  # (what the kill left: the executors' Python worker daemon)
        print("  starting the Connect server again...")
        server.up()
    print("\nrun 2: restarted from the same checkpoint")
    code = run_child({**plan, "kill": False}, f"plan-{run}-2")
    if server is not None:
        server.down()
    if code != 0:
        print(f"the restarted query failed (exit {code})")
        return 1

    with psycopg.connect(pg.conninfo(), autocommit=True) as conn:
        orders = sql.SQL("SELECT order_id FROM {}").format(sql.Identifier(schema, "orders"))
        pg_ids = [r[0] for r in conn.execute(orders)]
        prepared = conn.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%{plan['job_id']}%",)
        ).fetchone()
        decisions = conn.execute(
            sql.SQL("SELECT epoch, record FROM {} WHERE job_id = %s ORDER BY epoch").format(
                sql.Identifier(schema, "durable_sinks_decisions")
            ),
            (plan["job_id"],),
        ).fetchall()
    consumer = Consumer(
        kafka.config({"group.id": f"demo-{run}", "isolation.level": "read_committed"})
    )
    consumer.assign([TopicPartition(output, 0, 0)])
    kafka_ids: list[int] = []
    idle = time.monotonic()
    while time.monotonic() - idle < 3:
        for message in consumer.consume(1000, timeout=0.5):
            value = message.value()
            if message.error() is None and value:
                kafka_ids.append(json.loads(value)["order_id"])
                idle = time.monotonic()
    consumer.close()

    s3_path = f"s3://{s3.bucket}/demo-{run}/orders"
    s3_table = committed_dataset(s3_path, s3_sink_config(s3, s3_path).connection).to_table()
    s3_ids = s3_table.column("order_id").to_pylist()
    uploads = incomplete_uploads(s3.client(), s3.bucket, f"demo-{run}/")

    expected = set(range(ORDERS))
    print("\nwhat landed")
    print(f"  orders expected:                 {ORDERS}")
    ok = True
    landed = (
        ("Postgres rows", pg_ids),
        ("S3 rows (committed epochs)", s3_ids),
        ("Kafka records (read_committed)", kafka_ids),
    )
    for name, ids in landed:
        dupes = sum(n - 1 for n in Counter(ids).values() if n > 1)
        lost = len(expected - set(ids))
        ok = ok and dupes == 0 and lost == 0 and set(ids) == expected
        print(f"  {name + ':':33s}{len(ids)}  duplicates {dupes}  lost {lost}")
    print(f"  prepared transactions left:      {prepared[0] if prepared else '?'}")
    print(f"  incomplete S3 uploads left:      {len(uploads)}")
    ok = ok and not uploads and prepared is not None and prepared[0] == 0
    print("\nthe epochs' decisions (decision store: Postgres table durable_sinks_decisions)")
    for epoch, stored in decisions:
        record = DecisionRecord.from_bytes(bytes(stored), source=f"epoch {epoch}")
        print(f"  epoch {epoch:2d}: generation {record.generation}, rows {record.rows()}")
    print("\nexactly once: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2]))
    sys.exit(main(connect="--connect" in sys.argv[1:]))
