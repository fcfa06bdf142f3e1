"""Executor mode's start check: Spark's Python workers can import durable-sinks, of the
driver's release line (MAJOR.MINOR; core/formats.py `interoperate`), and build every sink of
the job.

Without it, a worker interpreter that lacks the package (or one of its dependencies) fails the
query's first batch with a ModuleNotFoundError deep in a task trace. The check runs one Spark
job of one task whose function is shipped by value (cloudpickle pickles a nested function's
code, not a reference to this module), so it runs even where durable-sinks is missing and
reports what it found.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from importlib.metadata import version as installed_version
from typing import TYPE_CHECKING, Any

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.formats import interoperate, release_line

from ._session import described

if TYPE_CHECKING:
    import pyarrow as pa

#: Where to read how to get the package onto Spark's Python workers.
_FIX = (
    "install durable-sinks (the driver's version, or another of its MAJOR.MINOR, with its "
    "dependencies) into the Python that Spark's workers run (PYSPARK_PYTHON when the "
    "SparkContext starts, or spark.pyspark.python; on a cluster, on every worker host), or "
    "point PYSPARK_PYTHON at the driver's interpreter; see docs/guide.md, 'Executor mode'"
)


def check_workers(
    spark: Any,
    sinks: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    job: str | None,
    version: str | None = None,
) -> None:
    """Raise ConfigError naming the fix unless a Spark task of `spark` imports durable-sinks
    of `version`'s release line (default: the driver's, as installed) and builds each (kind,
    config) of `sinks`. Nothing is written: building a sink checks its configuration and
    imports its client library."""
    version = version or installed_version("durable-sinks")
    report = _run(spark, [(kind, dict(config)) for kind, config in sinks], job)
    where = f"Spark's Python workers ({report.get('python')}, Python {report.get('py')})"
    error = report.get("error")
    if error is not None:
        what = "import durable-sinks" if report.get("version") is None else "build the sinks"
        raise ConfigError(
            f"executor mode writes from {where}, which cannot {what}: {error}",
            job=job,
            fix=_FIX,
        )
    found = report.get("version")
    if not isinstance(found, str) or not interoperate(found, version):
        raise ConfigError(
            f"executor mode writes from {where}, which have durable-sinks "
            f"{found}; the driver has {version}, which runs only with releases "
            f"{release_line(version)}.x",
            job=job,
            fix=_FIX,
        )


def _run(spark: Any, sinks: list[tuple[str, dict[str, Any]]], job: str | None) -> dict[str, Any]:
    probe = _probe(sinks)
    try:
        with described(spark, f"durable-sinks: job {job}, checking the executors' Python"):
            rows = spark.range(1, numPartitions=1).mapInArrow(probe, "report string").collect()
    except Exception as exc:
        raise ConfigError(
            f"executor mode's start check could not run a task on Spark's Python workers: "
            f"{_first_line(exc)}",
            job=job,
            fix=_FIX,
        ) from exc
    loaded: dict[str, Any] = json.loads(rows[0]["report"])
    return loaded


def _probe(
    sinks: list[tuple[str, dict[str, Any]]],
) -> Any:
    """The task's function. Nested, so that cloudpickle ships its code by value: unpickling it
    on the worker imports nothing of durable-sinks."""

    def probe(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import platform
        import sys

        import pyarrow as pa

        for _ in batches:
            pass
        report: dict[str, Any] = {
            "python": sys.executable,
            "py": platform.python_version(),
            "version": None,
            "error": None,
        }
        try:
            import durable_sinks
            from durable_sinks import sinks as registry

            report["version"] = durable_sinks.__version__
            for kind, config in sinks:
                registry.create(kind, config)
        except BaseException as exc:  # noqa: BLE001 - reported to the driver, which raises
            report["error"] = f"{type(exc).__name__}: {exc}"
        yield pa.record_batch([pa.array([json.dumps(report)])], names=["report"])

    return probe


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
