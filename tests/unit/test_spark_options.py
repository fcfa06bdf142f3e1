"""The pure parts of the Spark entry point: options, chunk planning, argument errors (no
Spark, no servers: these all fail before anything is contacted)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pyarrow as pa
import pytest

from durable_sinks.core import DeliveryGuarantee
from durable_sinks.core.errors import ConfigError
from durable_sinks.manifest import LocalDirectoryStore, store_from
from durable_sinks.manifest._choose import is_postgres_dsn
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.spark import JobOptions, durable_sink, sink
from durable_sinks.spark._arrow import grouped, plan_chunks


def test_chunks_hold_whole_partitions_and_at_most_max_rows() -> None:
    assert plan_chunks({0: 30, 1: 30, 2: 30, 3: 10}, 60) == [[0, 1], [2, 3]]
    assert plan_chunks({3: 5, 1: 5, 0: 5}, 100) == [[0, 1, 3]]
    # a partition larger than the bound is read alone; empty ones are skipped
    assert plan_chunks({0: 10, 1: 500, 2: 0, 3: 10}, 100) == [[0], [1], [3]]
    assert plan_chunks({}, 10) == []
    with pytest.raises(ValueError, match="max_rows"):
        plan_chunks({0: 1}, 0)


def _batches(*sizes: int, start: int = 0) -> list[pa.RecordBatch]:
    out, n = [], start
    for size in sizes:
        out.append(pa.record_batch({"id": pa.array(range(n, n + size), pa.int64())}))
        n += size
    return out


def test_record_batches_are_grouped_in_order_up_to_the_limits() -> None:
    source = _batches(4, 4, 4, 1, 0, 3)
    groups = list(grouped(iter(source), rows=8, nbytes=1 << 20))
    assert [g.num_rows for g in groups] == [8, 8]
    assert [v for g in groups for v in g.column(0).to_pylist()] == list(range(16))
    by_bytes = list(grouped(iter(_batches(4, 4, 4)), rows=100, nbytes=40))
    assert [g.num_rows for g in by_bytes] == [8, 4]  # 8 bytes a row: 64 >= 40 bytes
    assert [g.num_rows for g in grouped(iter(source), rows=0)] == [4, 4, 4, 1, 0, 3]
    other = pa.record_batch({"name": pa.array(["a"])})
    mixed = list(grouped(iter([*_batches(2), other, *_batches(2)]), rows=10))
    assert [(g.schema.names, g.num_rows) for g in mixed] == [
        (["id"], 2),
        (["name"], 1),
        (["id"], 2),
    ]


def test_closing_the_groups_closes_the_read_under_them() -> None:
    closed: list[bool] = []

    def read() -> Iterator[pa.RecordBatch]:
        try:
            yield from _batches(5, 5, 5)
        finally:
            closed.append(True)

    groups = grouped(read(), rows=5)
    assert next(groups).num_rows == 5
    groups.close()
    assert closed == [True]


def test_job_options_are_split_from_sink_options() -> None:
    job, rest = JobOptions.split({"job_id": "orders", "table": "t", "guarantee": "at_least_once"})
    assert job.job_id == "orders"
    assert job.guarantee is DeliveryGuarantee.AT_LEAST_ONCE
    assert rest == {"table": "t"}


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({}, "job_id"),
        ({"job_id": "  "}, "job_id"),
        ({"job_id": "j", "guarantee": "exactly-twice"}, "guarantee"),
        ({"job_id": "j", "execution": "cluster"}, "execution"),
        ({"job_id": "j", "mode": "driver", "execution": "executor"}, "the sink's option"),
        ({"job_id": "j", "max_rows_in_memory": 0}, "max_rows_in_memory"),
        ({"job_id": "j", "driver_read": "collect"}, "driver_read"),
        ({"job_id": "j", "retain_epochs": 0}, "retain_epochs"),
        ({"job_id": "j", "outage_tolerance_s": -1}, "outage_tolerance_s"),
        ({"job_id": "j", "outage_tolerance_s": float("inf")}, "outage_tolerance_s"),
        ({"job_id": "j", "outage_tolerance_s": "2 minutes"}, "outage_tolerance_s"),
        ({"job_id": "j", "checkpoint_location": ""}, "checkpoint_location"),
        ({"job_id": "j", "checkpoint_location": 3}, "checkpoint_location"),
    ],
)
def test_bad_job_options_name_the_option_and_the_fix(
    options: dict[str, object], names: str
) -> None:
    with pytest.raises(ConfigError, match=names) as caught:
        JobOptions.split(options)
    assert caught.value.fix


def test_durable_sink_refuses_bad_arguments_before_contacting_anything() -> None:
    with pytest.raises(ConfigError, match="job_id"):
        durable_sink("postgres", dsn="host=127.0.0.1 port=1", table="t")
    with pytest.raises(ConfigError, match="no sink kind 'postgress'"):
        durable_sink("postgress", dsn="host=x", table="t", job_id="j")
    with pytest.raises(ConfigError, match="table"):
        durable_sink("postgres", dsn="host=x", table="a.b.c", job_id="j")
    with pytest.raises(ConfigError, match="unknown option 'tabel'; did you mean 'table'"):
        durable_sink("postgres", dsn="host=x", table="t", tabel="u", job_id="j")
    with pytest.raises(ConfigError, match="are not job options"):
        durable_sink([sink("files", path="/tmp/x")], job_id="j", table="t")  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="non-empty list"):
        durable_sink([], job_id="j")
    with pytest.raises(ConfigError, match="is not a sink"):
        durable_sink(["postgres"], job_id="j")  # type: ignore[list-item]


def test_sink_specs_pickle_and_never_show_their_options() -> None:
    spec = sink("postgres", dsn="host=h user=u password=hunter2-secret", table="t")
    assert "hunter2" not in repr(spec)
    assert pickle.loads(pickle.dumps(spec)) == spec  # noqa: S301 - our own bytes


def test_decision_store_targets() -> None:
    assert is_postgres_dsn("postgresql://u@h/db")
    assert is_postgres_dsn("host=127.0.0.1 port=5432 dbname=x")
    assert not is_postgres_dsn("/data/orders/decisions")
    assert isinstance(store_from("host=h dbname=d"), PostgresDecisionStore)
    assert isinstance(store_from("/tmp/decisions"), LocalDirectoryStore)
    with pytest.raises(ConfigError, match="decision_store"):
        store_from("")


def test_execution_has_its_own_name_and_mode_is_the_postgres_sinks() -> None:
    job, rest = JobOptions.split({"job_id": "j", "mode": "upsert", "key": ("id",)})
    assert job.execution == "driver"
    assert rest == {"mode": "upsert", "key": ("id",)}
    job, rest = JobOptions.split({"job_id": "j", "execution": "executor", "mode": "append"})
    assert job.execution == "executor"
    assert rest == {"mode": "append"}


def test_mode_driver_or_executor_is_refused_naming_execution() -> None:
    with pytest.raises(ConfigError, match="is the sink's option") as raised:
        JobOptions.split({"job_id": "j", "mode": "executor"})
    assert raised.value.fix == "execution='executor'"


def test_data_source_options_are_read_from_spark_strings() -> None:
    from durable_sinks.spark._datasource import parse_options

    specs, job = parse_options(
        {
            "kind": "postgres",
            "job_id": "42",
            "dsn": "host=h port=5432 dbname=d",
            "table": "s.t",
            "create_table": "true",
            "participants_in_flight": "8",
            "outage_tolerance_s": "30.5",
            "path": "ignored",
            "checkpointLocation": "/ckpt",
        }
    )
    assert job.job_id == "42"
    assert job.execution == "executor"
    assert job.outage_tolerance_s == 30.5
    assert JobOptions.split({"job_id": "j"})[0].outage_tolerance_s == 120.0
    assert JobOptions.split({"job_id": "j", "outage_tolerance_s": 0})[0].outage_tolerance_s == 0
    assert specs[0].kind == "postgres"
    assert specs[0].config == {
        "dsn": "host=h port=5432 dbname=d",
        "table": "s.t",
        "create_table": True,
        "participants_in_flight": 8,
    }
    specs, _ = parse_options(
        {
            "job_id": "j",
            "sinks": '[{"kind": "files", "path": "/out"}, {"kind": "files", '
            '"path": "/out2", "name": "b"}]',
        }
    )
    assert [s.name for s in specs] == ["files", "b"]


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"job_id": "j"}, "needs option `kind`"),
        ({"job_id": "j", "sinks": "[1]"}, "JSON list of objects"),
        ({"job_id": "j", "sinks": "[]", "table": "t"}, "go inside each sink"),
        ({"job_id": "j", "kind": "files", "path2": "x", "execution": "driver"}, "always writes"),
        ({"job_id": "j", "kind": "files", "path2": "x", "mode": "driver"}, "sink's option"),
    ],
)
def test_bad_data_source_options_name_the_fix(options: dict[str, str], names: str) -> None:
    from durable_sinks.spark._datasource import parse_options

    with pytest.raises(ConfigError, match=names) as caught:
        parse_options(options)
    assert caught.value.fix


def test_spark_result_size_failures_are_recognised_however_wrapped() -> None:
    from durable_sinks.spark._arrow import _too_large, is_result_too_large

    spark_line = (
        "Total size of serialized results of 2 tasks (89.5 MiB) is bigger than "
        "spark.driver.maxResultSize (1024.0 KiB)"
    )
    wrapped = RuntimeError(f"An error occurred while calling o80.getResult.\n: {spark_line}")
    assert is_result_too_large(wrapped)
    assert str(_too_large(wrapped)) == f": {spark_line}"  # Spark's line, not py4j's
    assert not is_result_too_large(RuntimeError("Connection reset by peer"))
