"""What schema evolution adds to a batch of the S3 and files sinks (core/evolution.py).

    .venv/bin/python -m benchmarks.schema_evolution [--rows 1000000] [--rounds 5]

A batch of `--rows` rows (int32, float32, string) conformed to the dataset's schema: once when
the schemas are equal (the common case: nothing to do), once when two columns are widened
(int32 -> int64, float32 -> float64) and two are missing (null columns added). Best of
`--rounds`. Also the size of one recorded schema (what the handle holds per object and the
epoch marker per distinct schema).
"""

from __future__ import annotations

import argparse
import time

import pyarrow as pa

from durable_sinks.core.evolution import conform, evolve, schema_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    n = args.rows
    batch = pa.record_batch(
        {
            "id": pa.array(range(n), pa.int32()),
            "v": pa.array([1.5] * n, pa.float32()),
            "s": ["x" * 10] * n,
        }
    )
    evolved = pa.schema(
        [
            ("id", pa.int64()),
            ("v", pa.float64()),
            ("s", pa.string()),
            ("extra", pa.string()),
            ("more", pa.int64()),
        ]
    )
    for label, current in (("same schema", batch.schema), ("2 widened, 2 missing", evolved)):
        best = float("inf")
        for _ in range(args.rounds):
            start = time.perf_counter()
            conform(batch, evolve(current, batch.schema))
            best = min(best, time.perf_counter() - start)
        print(f"{label}: {best * 1000:.2f} ms per {n:,}-row batch (best of {args.rounds})")
    print(f"one recorded schema of {len(evolved)} columns: {len(schema_text(evolved))} bytes")


if __name__ == "__main__":
    main()
