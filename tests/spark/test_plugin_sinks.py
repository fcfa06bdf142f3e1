"""The reference JSON Lines sink and a sink kind installed by entry point, in real Spark
streaming queries through `durable_sink(kind, ..., job_id=...)`: every row lands once across
a replayed batch and a restart, from the driver and (for the built-in kind) from executors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from durable_sinks.coordinator import EpochOutcome
from durable_sinks.sinks.folder import ROWS, STAGING
from durable_sinks.spark import durable_sink

from .streams import run_available_now, source_stream, write_input


def published_ids(folder: Path) -> list[int]:
    """The `id` of every row a reader of the folder sees (published epochs only)."""
    return sorted(
        json.loads(line)["id"]
        for file in folder.glob(f"epoch=*/part=*/{ROWS}")
        for line in file.read_text().splitlines()
    )


def run_twice_with_a_replay(
    spark: Any, tmp_path: Path, kind: str, folder_option: str, job_id: str, **options: Any
) -> Path:
    """Three batches, a replay of batch 1, then a restart with a fourth batch."""
    source, checkpoint, out = tmp_path / "in", tmp_path / "checkpoint", tmp_path / "out"
    for n in range(3):
        write_input(source, f"part-{n}.json", range(n * 10, n * 10 + 10))
    settings = {
        folder_option: str(out),
        "job_id": job_id,
        "decision_store": str(tmp_path / "decisions"),
        **options,
    }
    writer = durable_sink(kind, **settings)
    run_available_now(source_stream(spark, source), writer, checkpoint)
    assert published_ids(out) == list(range(30))
    assert writer.last_result is not None
    assert writer.last_result.epoch == 2

    replayed = spark.read.schema("id LONG, body STRING").json(str(source / "part-1.json"))
    writer(replayed, 1)
    assert writer.last_result.outcome is EpochOutcome.ALREADY_COMMITTED
    assert published_ids(out) == list(range(30))

    write_input(source, "part-3.json", range(30, 40))
    restarted = durable_sink(kind, **settings)
    run_available_now(source_stream(spark, source), restarted, checkpoint)
    assert published_ids(out) == list(range(40))
    assert list((out / STAGING).iterdir()) == []
    return out


def test_the_reference_sink_in_a_streaming_job(spark: Any, job_id: str, tmp_path: Path) -> None:
    out = run_twice_with_a_replay(spark, tmp_path, "jsonl", "path", job_id)
    assert sorted(p.name for p in out.glob("epoch=*")) == [f"epoch={n}" for n in range(4)]
    # Spark's JSON reader reads the folder as it is (skipping `_staging` and the markers).
    read = spark.read.json(str(out))
    assert {"id", "epoch", "part"} <= set(read.columns)
    assert sorted(row["id"] for row in read.select("id").collect()) == list(range(40))


def test_the_reference_sink_prepared_on_executors(spark: Any, job_id: str, tmp_path: Path) -> None:
    source, checkpoint, out = tmp_path / "in", tmp_path / "checkpoint", tmp_path / "out"
    for n in range(2):
        write_input(source, f"part-{n}.json", range(n * 50, n * 50 + 50))
    writer = durable_sink(
        "jsonl",
        path=str(out),
        job_id=job_id,
        decision_store=str(tmp_path / "decisions"),
        execution="executor",
    )
    run_available_now(source_stream(spark, source).repartition(3), writer, checkpoint)
    assert published_ids(out) == list(range(100))
    result = writer.last_result
    assert result is not None
    assert len(result.decision.handles_for("jsonl")) == 3  # one participant per partition
    assert list((out / STAGING).iterdir()) == []


def test_a_sink_kind_installed_by_entry_point_in_a_streaming_job(
    spark: Any, plugin_dists: Path, job_id: str, tmp_path: Path
) -> None:
    run_twice_with_a_replay(spark, tmp_path, "ledger", "folder", job_id, durable=False)
