"""The screenshot of Spark's UI in docs/operations.md ("A batch is stuck"): a streaming query
of three micro-batches through `durable_sink` (a files sink), then Spark's jobs page, as
headless Chromium draws it (`apt-get install chromium`).

    .venv/bin/python -m tests.support.spark_ui_shot docs/img/spark_ui_jobs.png
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession

from durable_sinks import Files
from durable_sinks.spark import durable_sink
from tests.support.ports import free_port


def main(out: Path) -> None:
    port = free_port()
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("orders")
        .config("spark.ui.enabled", "true")
        .config("spark.ui.port", str(port))
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    root = Path(tempfile.mkdtemp())
    source = root / "in"
    source.mkdir()
    for batch in range(3):
        rows = (json.dumps({"id": batch * 10 + i, "body": "x"}) for i in range(10))
        (source / f"part-{batch}.json").write_text("\n".join(rows))
    writer = durable_sink(
        Files(str(root / "out")), job_id="orders", decision_store=str(root / "store")
    )
    query = (
        spark.readStream.schema("id LONG, body STRING")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(writer)
        .option("checkpointLocation", str(root / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={out.resolve()}",
            "--window-size=1400,620",
            f"http://127.0.0.1:{port}/jobs/",
        ],
        check=True,
        capture_output=True,
    )
    spark.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
