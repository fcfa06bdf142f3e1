"""`register_data_source`: makes `format("durable")` available in a Spark session."""

from __future__ import annotations

from typing import Any

from durable_sinks.core.errors import ConfigError

from ._worker_check import check_workers


def register_data_source(spark: Any) -> None:
    """Make `format("durable")` available in `spark` (a SparkSession). The data source always
    writes from Spark's Python workers, so this first checks, with a one-task Spark job, that
    they import durable-sinks at this version (ConfigError with the fix otherwise); each
    query's sinks are checked when it starts. Needs PySpark's Python Data Source API for
    streaming writes (pyspark 4.0 or newer): ConfigError on an older pyspark."""
    try:
        from ._datasource import DurableDataSource
    except ImportError as exc:
        if not (exc.name or "").startswith("pyspark"):
            raise
        import pyspark

        raise ConfigError(
            f'format("durable") needs PySpark\'s Python Data Source API for streaming writes '
            f"(pyspark 4.0 or newer); this is pyspark {pyspark.__version__} ({exc})",
            fix="write with df.writeStream.foreachBatch(durable_sink(...)), which works on "
            "every supported pyspark, or upgrade pyspark to 4.x",
        ) from None

    check_workers(spark, [], job=None)
    spark.dataSource.register(DurableDataSource)
