"""A job into Postgres and Kafka, run by the upgrade test with either release of durable-sinks:
`python tests/upgrade/job.py STATE --epochs N [--crash-after-decision E]` (settings in the
environment, below).

Run as a script by path (never `-m tests...`), so it imports only the installed durable-sinks
of the Python that runs it, and only what both the previous release and this one have: the
coordinator, the Postgres and Kafka sinks, the Postgres decision store.

Like Spark's checkpoint, `STATE/commits/<epoch>` is written after an epoch returns; a start
resumes at the first epoch without one (replaying it with the same rows). With
`--crash-after-decision E` the process SIGKILLs itself right after epoch E's decision: Kafka,
the last resource, has committed the epoch with its decision, Postgres is still prepared.
It prints `durable-sinks <version>` first.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import pyarrow as pa

import durable_sinks
from durable_sinks.coordinator import Coordinator
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.postgres import Postgres, PostgresSink

#: The environment: the Postgres DSN, the schema (table `events` and the decision store), the
#: Kafka bootstrap servers, the topic, the job id.
SETTINGS = ("UPGRADE_DSN", "UPGRADE_SCHEMA", "UPGRADE_BOOTSTRAP", "UPGRADE_TOPIC", "UPGRADE_JOB")
ROWS = 50


def epoch_rows(epoch: int) -> pa.RecordBatch:
    """The epoch's rows: the same every time (Spark replays deterministically)."""
    return pa.record_batch(
        {
            "key": pa.array([f"{epoch}:{i}" for i in range(ROWS)]),
            "n": pa.array([epoch * 1000 + i for i in range(ROWS)], pa.int64()),
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("state", type=Path)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--crash-after-decision", type=int)
    args = parser.parse_args(argv)
    dsn, schema, bootstrap, topic, job = (os.environ[name] for name in SETTINGS)
    print(f"durable-sinks {durable_sinks.__version__}", flush=True)
    commits = args.state / "commits"
    commits.mkdir(parents=True, exist_ok=True)
    current: dict[str, int | None] = {"epoch": None}

    def maybe_crash(step: str) -> None:
        if step == "after-decision" and current["epoch"] == args.crash_after_decision:
            os.kill(os.getpid(), signal.SIGKILL)

    coordinator = Coordinator(
        job,
        [
            PostgresSink(Postgres(dsn, f"{schema}.events", create_table=True)),
            KafkaSink(Kafka(bootstrap, topic, key_column="key")),
        ],
        PostgresDecisionStore(dsn, schema=schema),
        on_step=maybe_crash,
    )
    coordinator.start()
    epoch = 0
    while (commits / str(epoch)).exists():
        epoch += 1
    while epoch < args.epochs:
        current["epoch"] = epoch
        result = coordinator.run_epoch(epoch, [epoch_rows(epoch)])
        print(f"epoch {epoch}: {result.outcome.value}", flush=True)
        (commits / str(epoch)).write_text("done")
        epoch += 1
    coordinator.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
