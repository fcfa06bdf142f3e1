"""Spark's own Iceberg runtime, for reading the Iceberg sink's tables with an independent reader
and for benchmarking beside Spark's Iceberg streaming sink.

Maven Central has no `iceberg-spark-runtime` for the main lane's Spark (4.2); the 4.1 runtime
fails on pyspark 4.2 and works with pyspark 4.1. So this is an interpreter of its own: a
virtualenv with pyspark 4.1.4 and the checkout's dev extras (the `iceberg` extra among them),
on the Python line of the interpreter running the test bed, built by the compatibility lanes'
builder (tests/services/compat.py, cached by digest under `<cache>/compat/iceberg-spark-
<digest>`; `reset compat` deletes it too), plus the jars Spark's Iceberg catalog needs, from
Maven Central (maven/spark-iceberg-4.1.xml, cached under `<cache>/maven/`):

    iceberg-spark-runtime-4.1_2.13   the catalog, reader and streaming sink
    iceberg-aws-bundle               S3FileIO, for tables on S3 (the REST catalog's warehouse)
    postgresql                       Iceberg's JdbcCatalog on the test bed's Postgres

It is not a compatibility lane (`make test-compat` does not run the Spark tests in it): only
the Iceberg reader (tests/support/iceberg_spark_reader.py) and benchmarks/iceberg_spark.py use
it, with the session settings `session_conf` gives (the test bed's `local[2]` defaults and
these jars). Both are set-up steps: `up`
builds what is missing and starts nothing; `down` has nothing to stop.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ._layout import Layout
from ._maven import classpath, require_java
from ._service import Status
from ._steps import is_complete
from .compat import CompatLanes, Lane
from .spark import DEFAULT_CONF, java_options

NAME = "iceberg-spark"
#: The interpreter: the Python line of the one running the test bed (the main venv's: nothing
#: more to install), the newest pyspark Maven Central has an Iceberg runtime for.
LANE = Lane(NAME, f"{sys.version_info.major}.{sys.version_info.minor}", "4.1.4")
#: The jars, by the pom that lists them.
POM = "spark-iceberg-4.1.xml"


class IcebergSpark:
    """The interpreter and jars, as a set-up step of the test bed (`python -m tests.services up
    iceberg-spark`)."""

    name = NAME

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.lanes = CompatLanes(layout)

    def python(self) -> Path:
        """The interpreter with pyspark 4.1.4 (its virtualenv's `bin/python`), built if need
        be. The durable-sinks installed in it is whatever was last installed (see
        compat.install_wheel); the reader needs none of it."""
        return self.lanes.python(LANE)

    def jars(self) -> Path:
        """The folder of Spark's Iceberg jars, fetched if need be."""
        return classpath(NAME, POM, self.layout.cache)

    def session_conf(self, **conf: str) -> dict[str, str]:
        """The settings of a `local[2]` session in the interpreter (what `Spark.session()`
        gives there: the test bed's defaults, its JVM options, the Iceberg jars), `conf`
        over them, for a child that builds its session from them alone."""
        settings = {
            **DEFAULT_CONF,
            "spark.jars": ",".join(str(jar) for jar in sorted(self.jars().glob("*.jar"))),
            **conf,
        }
        settings.update(java_options(settings))
        return settings

    # -- the Service protocol ---------------------------------------------------------------

    def up(self) -> None:
        require_java(NAME)
        self.jars()
        self.python()

    def down(self) -> None:
        """Nothing runs between uses."""

    def reset(self) -> None:
        """Nothing of the test bed's data lives here; the cached builds are kept."""

    def status(self) -> Status:
        built = is_complete(self.lanes.folder(LANE))
        detail = f"{LANE.describe()}, jars of maven/{POM} ({'ready' if built else 'not built'})"
        return Status(NAME, built, None, detail, ())
