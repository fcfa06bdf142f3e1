"""Spark from the pyspark wheel, `local[2]` on Java 17, plus the jars baselines need.

Spark is not a daemon here: each process that needs it starts its own driver JVM through
`session()`. `up` makes sure Java is there and that the extra jars are fetched from Maven
Central and cached: for the main lane's pyspark (tests/constraints.txt) the Postgres JDBC
driver, Spark's Kafka connector and Delta's reader (maven/spark-extras.xml); for the
compatibility lanes' (tests/services/compat.py) what that version's wheel lacks to run a
Spark Connect server (maven/spark-compat-<line>.xml).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._layout import Layout
from ._maven import classpath, java_major_version, require_java
from ._process import ServiceError
from ._service import Status

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NAME = "spark"
#: The pom of the extra jars, by the pyspark line (major.minor) installed; a line without one
#: gets no extra jars (its wheel has what the tests it runs need).
POMS = {"4.2": "spark-extras.xml", "3.5": "spark-compat-3.5.xml"}
_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")

# Small, predictable, and kind to a 2-core, shared machine.
DEFAULT_CONF = {
    "spark.master": "local[2]",
    "spark.driver.memory": "1g",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}


#: JVM options the test session gives every Spark driver (and executor) that `session()`
#: starts, from this variable; tests/conftest.py sets it for the pytest session and the
#: processes it starts, benchmarks and the soak leave it unset.
JAVA_OPTIONS_ENV = "DS_SPARK_JAVA_OPTIONS"
#: What tests/conftest.py sets: the client compiler only. A test's JVM lives seconds to a
#: minute on little data, where the optimizing compiler's work never pays back: a session's
#: start and a small job took 12 CPU-seconds instead of 20 (measured, 2 cores), and the
#: suite is bound by CPU.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1"


def java_options(conf: Mapping[str, str]) -> dict[str, str]:
    """`conf`'s driver and executor JVM options with JAVA_OPTIONS_ENV's added, if it is set."""
    extra = os.environ.get(JAVA_OPTIONS_ENV, "").strip()
    if not extra:
        return {}
    keys = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")
    return {key: f"{conf[key]} {extra}" if conf.get(key) else extra for key in keys}


def _artifact(jar: Path) -> str:
    match = _VERSIONED_JAR.match(jar.name)
    return match.group("artifact") if match else jar.stem


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def pyspark_line() -> str:
    """The installed pyspark's major.minor, e.g. "4.2"."""
    import pyspark

    return ".".join(pyspark.__version__.split(".")[:2])


class Spark:
    name = NAME

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def up(self) -> None:
        require_java(NAME)
        self.extra_jars()

    def extra_jars(self) -> list[Path]:
        """Jars to add to `spark.jars`: what the pom brings that the wheel lacks.

        Artifacts the wheel already ships (Hadoop, Scala, slf4j, ...) are left out so the
        driver never sees two versions of one library.
        """
        pom = POMS.get(pyspark_line())
        if pom is None:
            return []
        lib = classpath(NAME, pom, self.layout.cache)
        shipped = {_artifact(jar) for jar in pyspark_jars_dir().glob("*.jar")}
        return sorted(j for j in lib.glob("*.jar") if _artifact(j) not in shipped)

    def has_delta(self) -> bool:
        """Whether Delta's Spark reader is among the extra jars (the main lane's pyspark)."""
        return any(_artifact(jar).startswith("delta-spark") for jar in self.extra_jars())

    def down(self) -> None:
        """Nothing runs between sessions: each test process owns its driver."""

    def reset(self) -> None:
        """Spark keeps no state of the test bed's; checkpoints live in tests' own folders."""

    def status(self) -> Status:
        import pyspark

        java = java_major_version()
        try:
            jars = ", ".join(_artifact(j) for j in self.extra_jars())
        except ServiceError as exc:
            jars = f"extra jars unavailable: {exc.problem.splitlines()[0]}"
        detail = f"pyspark {pyspark.__version__}, java {java}, local[2]; jars: {jars}"
        return Status(NAME, java is not None, None, detail, ())

    def session(self, app_name: str, **conf: str) -> SparkSession:
        """A `local[2]` SparkSession with the extra jars on its classpath."""
        from pyspark.sql import SparkSession

        builder: Any = SparkSession.builder.appName(app_name)
        # Python workers (mapInArrow, UDFs) must run this interpreter, with this virtualenv's
        # packages, not whatever `python3` is first on PATH (pyspark reads only the variable).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        settings = {
            **DEFAULT_CONF,
            "spark.jars": ",".join(map(str, self.extra_jars())),
            **conf,
        }
        settings.update(java_options(settings))
        for key, value in settings.items():
            builder = builder.config(key, value)
        session: SparkSession = builder.getOrCreate()
        return session
