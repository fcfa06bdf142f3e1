"""durable-sinks uses only PySpark's public API, but for one probed fast path.

The one exception is driver mode's socket read (`socket_batches` in spark/_arrow.py), which
reaches PySpark's collect-as-Arrow socket through the DataFrame's JVM object; it runs only
where its probe passed and has a public fallback. Anything else private (a JVM handle, the
SparkContext behind a session, py4j, an underscored PySpark name) would tie the package to
one PySpark version and fail under Spark Connect: these tests read every module's syntax
tree and fail on any such use outside that function.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
#: The folders that install as durable_sinks (pyproject.toml's package-dir).
PACKAGE_FOLDERS = ("src/durable_sinks", "sinks", "coordinator", "manifest")
#: Attributes of PySpark objects that lead into the JVM or PySpark's internals.
PRIVATE_ATTRIBUTES = frozenset(
    {"_jdf", "_jvm", "_sc", "_jsc", "_jsparkSession", "_jconf", "_gateway", "_jwrite", "_jreader"}
)
#: (module path relative to the repository, function) allowed to use them: the fast path.
ALLOWED = {("src/durable_sinks/spark/_arrow.py", "socket_batches")}


@dataclass(frozen=True)
class Use:
    path: str
    line: int
    function: str | None
    what: str


def private_spark_uses(source: str, path: str) -> list[Use]:
    """Every private PySpark use in `source`: a PRIVATE_ATTRIBUTES attribute, `py4j`, an
    underscored name imported from pyspark, `getattr(..., "_name")` or
    `import_module("pyspark...")._name`; each with the function it is in."""
    tree = ast.parse(source)
    uses: list[Use] = []

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name if function is None else function
        what = _private(node)
        if what is not None:
            uses.append(Use(path, getattr(node, "lineno", 0), function, what))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return uses


def _private(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES:
        return f".{node.attr}"
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == "py4j":
                return f"import {alias.name}"
    if isinstance(node, ast.ImportFrom) and node.module:
        root = node.module.split(".")[0]
        if root == "py4j":
            return f"from {node.module} import ..."
        if root == "pyspark":
            for alias in node.names:
                if alias.name.startswith("_"):
                    return f"from {node.module} import {alias.name}"
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and _underscored(str(node.args[1].value))
    ):
        return f"getattr(..., {node.args[1].value!r})"
    if (
        isinstance(node, ast.Attribute)
        and _underscored(node.attr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "import_module"
        and node.value.args
        and isinstance(node.value.args[0], ast.Constant)
        and str(node.value.args[0].value).startswith("pyspark")
    ):
        return f"import_module({node.value.args[0].value!r}).{node.attr}"
    return None


def _underscored(name: str) -> bool:
    """A private name (`_x`), not a dunder (`__cause__`, `__name__`: Python's own)."""
    return name.startswith("_") and not name.startswith("__")


def _package_modules() -> list[Path]:
    return sorted(p for folder in PACKAGE_FOLDERS for p in (REPOSITORY / folder).rglob("*.py"))


def test_no_module_uses_a_private_spark_attribute_outside_the_probed_fast_path() -> None:
    modules = _package_modules()
    assert len(modules) > 50, "the package's modules were not found"
    found = [
        use
        for path in modules
        for use in private_spark_uses(path.read_text(), str(path.relative_to(REPOSITORY)))
        if (use.path, use.function) not in ALLOWED
    ]
    assert found == [], "\n".join(
        f"{u.path}:{u.line} ({u.function or 'module'}): {u.what}" for u in found
    )


def test_the_fast_path_is_where_the_allowance_says() -> None:
    """The allowance is not stale: the socket read does use the JVM object."""
    path, function = next(iter(ALLOWED))
    uses = private_spark_uses((REPOSITORY / path).read_text(), path)
    assert any(u.function == function and u.what == "._jdf" for u in uses), uses


def test_the_scan_finds_each_kind_of_private_use() -> None:
    source = """
import py4j.java_gateway
from pyspark.util import _load_from_socket
from importlib import import_module

def read(df, spark):
    df._jdf.collectAsArrowToPython()
    spark._jsc.sc()
    spark.sparkContext._jvm.java.lang.System
    getattr(df, "_jdf")
    import_module("pyspark.rdd")._load_from_socket
"""
    kinds = [use.what for use in private_spark_uses(source, "example.py")]
    assert kinds == [
        "import py4j.java_gateway",
        "from pyspark.util import _load_from_socket",
        "._jdf",
        "._jsc",
        "._jvm",
        "getattr(..., '_jdf')",
        "import_module('pyspark.rdd')._load_from_socket",
    ]
    assert {u.function for u in private_spark_uses(source, "example.py")} == {None, "read"}
