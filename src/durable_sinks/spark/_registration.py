"""`register_data_source`: makes `format("durable")` available in a Spark session."""

from __future__ import annotations

from typing import Any


def register_data_source(spark: Any) -> None:
    """Make `format("durable")` available in `spark` (a SparkSession)."""
    from ._datasource import DurableDataSource

    spark.dataSource.register(DurableDataSource)
