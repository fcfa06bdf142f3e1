"""What the content digest costs (src/durable_sinks/core/content.py): summarises epochs of
mixed int/string/float/timestamp columns with nulls, as Spark hands them to driver mode
(record batches of spark.sql.execution.arrow.maxRecordsPerBatch = 10,000 rows), and prints
the median and the minimum per epoch, in CPU time of the thread (time.thread_time: the machine's
other processes stretch wall time, not this).

    .venv/bin/python -m tests.support.content_bench [--rows 100000] [--batch-rows 10000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from durable_sinks.core.content import summarise

UTC = timezone.utc


def make_epoch(rows: int, body_chars: int, null_share: float, seed: int = 7) -> pa.Table:
    """benchmarks/postgres_sink.py's rows (id, body, score, at) plus nulls in every column but
    id; bodies of about `body_chars` characters."""
    rng = random.Random(seed)
    start = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1e6)
    ids = pa.array(range(rows), pa.int64())
    filler = "lorem ipsum dolor sit amet " * (1 + body_chars // 27)
    bodies = [f"event body {i % 1000:04d} {filler}"[:body_chars] for i in range(rows)]
    mask = pa.array([rng.random() < null_share for _ in range(rows)])
    return pa.table(
        {
            "id": ids,
            "body": pc.if_else(mask, None, pa.array(bodies)),
            "score": pc.if_else(mask, None, pa.array([rng.random() for _ in range(rows)])),
            "at": pc.if_else(
                mask, None, pc.add(pc.multiply(ids, 1000), start).cast(pa.timestamp("us", "UTC"))
            ),
            "qty": pc.if_else(
                mask, None, pa.array([rng.randrange(1000) for _ in range(rows)], pa.int32())
            ),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    for body_chars in (27, 100):
        for digest in (True, False):
            table = make_epoch(args.rows, body_chars, 0.1)
            batches = table.to_batches(max_chunksize=args.batch_rows)
            summarise(batches, digest=digest)  # warm-up (imports, caches)
            times = []
            for _ in range(args.repeat):
                started = time.thread_time()
                summarise(batches, digest=digest)
                times.append(time.thread_time() - started)
            level = "digest" if digest else "count"
            print(
                f"{args.rows:,} rows in batches of {args.batch_rows:,}, body ~{body_chars} chars, "
                f"{level}: median {statistics.median(times) * 1e3:.2f} ms, min "
                f"{min(times) * 1e3:.2f} ms ({table.nbytes / 1e6:.1f} MB of Arrow)"
            )


if __name__ == "__main__":
    main()
