"""`register_data_source`: makes `format("durable")` available in a Spark session."""

from __future__ import annotations

from typing import Any

from ._worker_check import check_workers


def register_data_source(spark: Any) -> None:
    """Make `format("durable")` available in `spark` (a SparkSession). The data source always
    writes from Spark's Python workers, so this first checks, with a one-task Spark job, that
    they import durable-sinks at this version (ConfigError with the fix otherwise); each
    query's sinks are checked when it starts."""
    from ._datasource import DurableDataSource

    check_workers(spark, [], job=None)
    spark.dataSource.register(DurableDataSource)
