"""A `format("durable")` job in a Spark application of its own, then a scan of everything Spark
shows of it for one secret.

    python -m tests.spark.exposure_child PLAN.json

The session has its UI on (`ui_port`) and an uncompressed event log (`event_log`, a folder);
the query writes the JSON files of `source` to Postgres (`dsn`, a URL holding the password, as
the `dsn` option and inside a `sinks` option) under `job_id`, trigger availableNow, checkpoint
`checkpoint`. Then it scans for `secret`: the query's `explain(True)`, its progress, the UI's
REST API (SQL with plans, jobs, stages, environment) and pages (Structured Streaming, SQL), and
the event log once the session stopped. It prints one JSON line: `{"error": ..., "found": {place:
bool}, "controls": {...}}`; `controls` proves the scan reads what it claims (a setting of the
session's is seen in the environment page and the event log). Its own application, because task
attempt ids, the UI and the event log are per application.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

#: A session setting every scan of the environment and the event log must find.
CONTROL = "durable-sinks-exposure-control"


def main(plan: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from durable_sinks.spark import register_data_source
    from tests.spark.streams import source_stream

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    port = int(plan["ui_port"])
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("exposure")
        .config("spark.ui.enabled", "true")
        .config("spark.ui.port", str(port))
        .config("spark.port.maxRetries", "0")
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.compress", "false")
        .config("spark.eventLog.dir", plan["event_log"])
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.durable.exposure", CONTROL)
        .getOrCreate()
    )
    register_data_source(spark)
    sink = {"kind": "postgres", "dsn": plan["dsn"], "table": plan["table"], "create_table": True}
    forms = {
        "sinks": {"sinks": json.dumps([sink])},
        "kind": {"kind": "postgres", "dsn": plan["dsn"], "create_table": "true"},
    }
    writer = source_stream(spark, Path(plan["source"])).writeStream.format("durable")
    options = {"job_id": plan["job_id"], "table": plan["table"], **forms[plan["form"]]}
    if "first_epoch" in plan:
        options["first_epoch"] = str(plan["first_epoch"])
    if plan["form"] == "sinks":
        del options["table"]
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.option("checkpointLocation", plan["checkpoint"]).trigger(availableNow=True)
    started = query.start()
    with contextlib.suppress(Exception):  # the query's error, if any, is read just below
        started.awaitTermination(240)
    error = started.exception()
    secret = plan["secret"]
    found: dict[str, bool] = {}
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        started.explain(True)
    found["explain"] = secret in shown.getvalue()
    found["progress"] = secret in json.dumps(started.recentProgress, default=str)
    app = spark.sparkContext.applicationId
    base = f"http://127.0.0.1:{port}"
    api = f"/api/v1/applications/{app}"
    pages = {
        "ui sql": f"{api}/sql?details=true&planDescription=true",
        "ui jobs": f"{api}/jobs",
        "ui stages": f"{api}/stages?details=true",
        "ui environment": f"{api}/environment",
        "ui streaming": "/StreamingQuery/",
        "ui sql page": "/SQL/",
    }
    read = {name: _get(base + path) for name, path in pages.items()}
    for name, text in read.items():
        found[name] = secret in text
    controls = {"ui environment": CONTROL in read["ui environment"]}
    spark.stop()
    logs = [p for p in Path(plan["event_log"]).rglob("*") if p.is_file()]
    text = "".join(p.read_text(errors="replace") for p in logs)
    found["event log"] = secret in text
    controls["event log"] = CONTROL in text
    return {"error": None if error is None else str(error), "found": found, "controls": controls}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 - the UI's http URL
        return bytes(answer.read()).decode(errors="replace")


if __name__ == "__main__":
    result = main(json.loads(Path(sys.argv[1]).read_text()))
    print(json.dumps(result))
    sys.exit(0)
