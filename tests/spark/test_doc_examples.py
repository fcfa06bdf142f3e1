"""Every Python example of the README and docs/ that is not marked typecheck-only runs here,
against the test bed, as a reader would run it (tests/support/doc_examples.py): one page's
blocks in page order in one namespace, which starts with the names the docs assume (`spark`:
the shared session; `df`: a file stream of a few orders; `dsn`: a database of the test's own
on the bed's Postgres; `brokers`: the bed's Kafka; `topic`: a
new topic name; `lake`: a folder of the test's own, or a prefix
in the bed's bucket; `checkpoints`: a folder), in a
working directory of its own.

Each streaming query a block starts is run until it has processed every available row, then
stopped: it must have read all of them without an error. Some pages' rows are then read back
from their targets (CHECKS). A block that raises fails its page's test, which names the page
and line."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from pyspark.errors import StreamingQueryException

from tests.services import KafkaEndpoint, PostgresEndpoint, S3Endpoint
from tests.support import doc_examples

#: The user property the test records its counts under (printed at the end of the run).
RUN_PROPERTY = "doc-examples-run"
#: The orders of the examples' `df` (the columns of doc_examples.SOURCE_COLUMNS).
ORDERS: list[dict[str, Any]] = [
    {"order_id": i, "customer": f"c{i % 3}", "customer_id": i, "amount": 10.0 * i, "id": i}
    for i in range(1, 7)
]
#: The loggers examples configure (besides the root logger).
LOGGERS = ("durable_sinks", "durable_sinks.epochs")
#: The pages whose examples run here; a page with a whole program has a test of its own.
PAGES = [
    p
    for p in doc_examples.PAGES
    if any(b.runs for b in doc_examples.blocks(p))
    and not any(b.file for b in doc_examples.blocks(p))
]


def _rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


def _postgres_count(*tables: str) -> Callable[[dict[str, Any]], None]:
    def check(names: dict[str, Any]) -> None:
        for table in tables:
            ids = _rows(names["dsn"], f"SELECT order_id FROM {table} ORDER BY order_id")
            assert [i for (i,) in ids] == [o["order_id"] for o in ORDERS], table

    return check


def _guide(names: dict[str, Any]) -> None:
    # one job through foreachBatch, one through format("durable"), both into public.events
    ids = _rows(names["dsn"], "SELECT order_id FROM public.events ORDER BY order_id")
    assert [i for (i,) in ids] == sorted(2 * [int(o["order_id"]) for o in ORDERS])
    _postgres_count("public.orders")(names)


def _order_ids(table: Any) -> list[int]:
    return sorted(table.column("order_id").to_pylist())


def _delta(names: dict[str, Any]) -> None:
    from deltalake import DeltaTable

    for table in ("events", "orders"):  # appended, and merged by key
        read = DeltaTable(f"{names['lake']}/{table}").to_pyarrow_table()
        assert _order_ids(read) == [o["order_id"] for o in ORDERS], table
    _postgres_count("public.orders")(names)


def _files(names: dict[str, Any]) -> None:
    # the page's own read of the committed files, with their unified schema
    assert sorted(r["order_id"] for r in names["df"].collect()) == [o["order_id"] for o in ORDERS]


def _iceberg(names: dict[str, Any]) -> None:
    catalog = names["events"].catalog
    scanned = _iceberg_catalog(catalog).load_table(("analytics", "events")).scan().to_arrow()
    assert _order_ids(scanned) == [o["order_id"] for o in ORDERS]


def _iceberg_catalog(properties: Any) -> Any:
    import os

    from pyiceberg.catalog import load_catalog

    resolved = {k: os.path.expandvars(v.replace("${env:", "${")) for k, v in properties.items()}
    return load_catalog("lake", **resolved)


def _s3(names: dict[str, Any]) -> None:
    # the page's own read through the epoch markers
    assert _order_ids(names["table"]) == [o["order_id"] for o in ORDERS]


#: What a page's examples must have left in their targets, read back as readers would.
CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "README.md": _postgres_count("public.events", "public.orders"),
    "guide.md": _guide,
    "dead-letters.md": _postgres_count("public.events"),
    "delta.md": _delta,
    "files.md": _files,
    "iceberg.md": _iceberg,
    "s3.md": _s3,
}


@pytest.fixture
def names(
    page: Path,
    spark: Any,
    postgres: PostgresEndpoint,
    database: str,
    kafka: KafkaEndpoint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> Iterator[dict[str, Any]]:
    """The names every example may assume (doc_examples.PRELUDE), bound to the test bed, and
    what a page's examples take from the environment. The topic an example creates (and its
    progress topic) is deleted afterwards."""
    source = tmp_path / "incoming"
    source.mkdir()
    (source / "orders-1.json").write_text("".join(json.dumps(o) + "\n" for o in ORDERS))
    (tmp_path / "lake").mkdir()
    lake = str(tmp_path / "lake")
    monkeypatch.chdir(tmp_path)
    if page.name == "s3.md":  # the bucket, through boto3's own variables
        s3: S3Endpoint = request.getfixturevalue("s3")
        lake = f"s3://{s3.bucket}/docs-{uuid.uuid4().hex[:12]}"
        for variable, value in {
            "AWS_ENDPOINT_URL": s3.endpoint_url,
            "AWS_REGION": s3.region,
            "AWS_ACCESS_KEY_ID": s3.access_key_id,
            "AWS_SECRET_ACCESS_KEY": s3.secret_access_key,
        }.items():
            monkeypatch.setenv(variable, value)
    if page.name == "iceberg.md":  # a SQL catalog in the test's database, its namespace made
        p = postgres
        uri = f"postgresql+psycopg://{quote(p.user, safe='')}:{quote(p.password, safe='')}"
        monkeypatch.setenv("LAKE_CATALOG_URI", f"{uri}@{p.host}:{p.port}/{database}")
        monkeypatch.setenv("LAKE_WAREHOUSE", f"file://{tmp_path / 'warehouse'}")
        catalog = {"type": "sql", "uri": "${env:LAKE_CATALOG_URI}"}
        _iceberg_catalog({**catalog, "warehouse": "${env:LAKE_WAREHOUSE}"}).create_namespace(
            "analytics"
        )
    monkeypatch.setenv("KAFKA_PASSWORD", "not-used")  # security.md's producer settings
    topic = f"docs-{uuid.uuid4().hex[:12]}"
    yield {
        "__name__": "__doc_example__",
        "spark": spark,
        "df": spark.readStream.schema(doc_examples.SOURCE_COLUMNS).json(str(source)),
        "dsn": postgres.conninfo(dbname=database),
        "brokers": kafka.bootstrap_servers,
        "lake": lake,
        "incoming": str(source),
        "checkpoints": str(tmp_path / "checkpoints"),
        "topic": topic,
    }
    admin = AdminClient(kafka.config())
    present = set(admin.list_topics(timeout=30).topics)
    made = [t for t in (topic, f"{topic}-ds-progress") if t in present]
    if made:
        for future in admin.delete_topics(made, request_timeout=30).values():
            future.result(timeout=30)


class Queries(threading.Thread):
    """Runs every streaming query started after it, while a block runs (a block may wait for
    its query, `query.awaitTermination()`): each to the end of its input, then stopped, with
    what it read and its error."""

    def __init__(self, spark: Any) -> None:
        super().__init__(daemon=True)
        self.spark = spark
        self.before = {q.id for q in spark.streams.active}
        self.done: dict[str, tuple[int, BaseException | None]] = {}
        self._finish = threading.Event()

    def run(self) -> None:
        while True:
            last = self._finish.is_set()
            for query in self.spark.streams.active:
                if query.id not in self.before and query.id not in self.done:
                    self.done[query.id] = self._settle(query)
            if last:
                return
            self._finish.wait(0.2)

    @staticmethod
    def _settle(query: Any) -> tuple[int, BaseException | None]:
        error: BaseException | None = None
        try:
            query.processAllAvailable()
        except StreamingQueryException as exc:  # the block's own wait raises it too
            error = exc
        finally:
            query.stop()
        progress = query.recentProgress
        return sum(
            p["numInputRows"] if isinstance(p, dict) else p.numInputRows for p in progress
        ), error

    def finish(self, where: str) -> None:
        """Settle the queries still running, then check that each read every order."""
        self._finish.set()
        self.join(timeout=300)
        assert not self.is_alive(), f"{where}: a query did not settle"
        for read, error in self.done.values():
            assert error is None, f"{where}: {error}"
            assert read == len(ORDERS), f"{where}: the query read {read} rows"


@contextlib.contextmanager
def logging_kept() -> Iterator[None]:
    """The logging set-up as it was: examples configure logging as a job would."""
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in LOGGERS)]
    kept = [(lg, lg.level, list(lg.handlers)) for lg in loggers]
    try:
        yield
    finally:
        for logger, level, handlers in kept:
            for handler in logger.handlers:
                if handler not in handlers:
                    handler.close()
            logger.setLevel(level)
            logger.handlers[:] = handlers


def _param(page: Path) -> Any:
    """A page as a test case. Pages whose examples start a Kafka sink run one after another on
    one worker: the examples share job ids (`orders`), and a Kafka sink's `transactional.id`
    (`ds:<job>:<sink>`) is its job's identity on the broker, so two such pages at once fence
    each other as two drivers of one job would."""
    kafka = any(
        b.runs and re.search(r"""["']kafka["']|Kafka\(""", b.code)
        for b in doc_examples.blocks(page)
    )
    marks = [pytest.mark.xdist_group("doc-examples-kafka")] if kafka else []
    return pytest.param(page, id=page.name, marks=marks)


@pytest.mark.parametrize("page", [_param(p) for p in PAGES])
def test_the_examples_of_a_page_run_against_the_test_bed(
    page: Path,
    spark: Any,
    names: dict[str, Any],
    record_property: Callable[[str, object], None],
) -> None:
    found = doc_examples.blocks(page)
    run = [b for b in found if b.runs]
    namespace = dict(names)
    with logging_kept():
        for block in run:
            # blank lines first, so that a traceback's line numbers are the page's
            code = compile("\n" * (block.line - 1) + block.code, str(block.page), "exec")
            queries = Queries(spark)
            queries.start()
            try:
                exec(code, namespace)  # noqa: S102 (the docs' own examples)
            finally:
                queries.finish(block.where)
    record_property(RUN_PROPERTY, {"run": len(run), "typecheck_only": len(found) - len(run)})
    check = CHECKS.get(page.name)
    if check is not None:
        check(namespace)
