"""What `pip install` gives a user: one import namespace, `durable_sinks`, whose public entry
loads no Spark and no database or Kafka client, and every module of the repository in it; a
base install that requires no sink's client, each of which comes with its extra."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from durable_sinks.core.extras import EXTRAS
from tests.support.checkout import checkout_files
from tests.support.venvs import build_wheel, purelib, venv_with_our_dependencies

REPO = Path(__file__).resolve().parents[2]
#: Repository folder -> installed package (pyproject.toml's package-dir).
FOLDERS = {
    "src/durable_sinks": "durable_sinks",
    "sinks": "durable_sinks/sinks",
    "coordinator": "durable_sinks/coordinator",
    "manifest": "durable_sinks/manifest",
}
#: Modules whose loading `from durable_sinks import durable_sink, sink` must not cause.
HEAVY = ("pyspark", "py4j", "psycopg", "confluent_kafka", "pgpq", "boto3", "orjson", "hypothesis")
#: Each sink's extra and the distributions it must install (core/extras.py names their modules).
SINK_EXTRAS = {
    "postgres": {"psycopg", "pgpq"},
    "kafka": {"confluent-kafka", "orjson"},
    "s3": {"boto3"},
    "delta": {"deltalake"},
    "iceberg": {"pyiceberg", "sqlalchemy"},
}
CLIENTS = set().union(*SINK_EXTRAS.values()) | {"botocore", "psycopg-binary"}


def _source_files() -> list[Path]:
    """The repository's files as a fresh clone has them (tracked, and new ones not ignored)."""
    return [REPO / name for name in checkout_files(REPO) if (REPO / name).is_file()]


def _modules_in_repository() -> set[str]:
    found = set()
    for path in _source_files():
        relative = path.relative_to(REPO).as_posix()
        for folder, package in FOLDERS.items():
            if relative.startswith(folder + "/") and relative.endswith(".py"):
                found.add(package + relative[len(folder) :])
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the repository's files, as a fresh clone would build."""
    return build_wheel(tmp_path_factory.mktemp("clone"), tmp_path_factory.mktemp("dist"))


@pytest.mark.slow
def test_the_wheel_installs_one_namespace_with_every_module(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"durable_sinks"}
    metadata = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(metadata).decode().split() == ["durable_sinks"]
    # Every module of the repository's package folders is in it (the package list in
    # pyproject.toml is explicit: a folder missing there would silently be left out).
    assert _modules_in_repository() <= {n for n in names if n.endswith(".py")}
    assert "durable_sinks/py.typed" in names


@pytest.mark.slow
def test_a_fresh_venv_imports_the_public_entry_without_drivers(wheel: Path, tmp_path: Path) -> None:
    """A new virtualenv with the wheel installed (its dependencies come from this one's
    site-packages, added as a plain path, not from the package index): the public import
    works from any folder and loads no Spark, database or Kafka client."""
    python = venv_with_our_dependencies(tmp_path / "venv", wheels=[wheel])
    probe = (
        "import json, sys\n"
        "from durable_sinks import durable_sink, sink\n"
        "import durable_sinks\n"
        "print(json.dumps({'file': durable_sinks.__file__, "
        "'loaded': sorted({m.split('.')[0] for m in sys.modules})}))\n"
    )
    done = subprocess.run(
        [str(python), "-c", probe],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1"},
    )
    report = json.loads(done.stdout)
    assert report["file"].startswith(purelib(python)), report["file"]
    assert not set(HEAVY) & set(report["loaded"]), sorted(set(HEAVY) & set(report["loaded"]))


def test_the_conformance_suite_without_hypothesis_names_the_extra() -> None:
    probe = (
        "import sys\n"
        "sys.modules['hypothesis'] = None  # as if it were not installed\n"
        "try:\n"
        "    import durable_sinks.testing\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    assert "pip install 'durable-sinks[testing]'" in done.stdout, done.stdout + done.stderr


def _requirements(wheel: Path) -> list[Requirement]:
    """The wheel's Requires-Dist lines: what pip installs for it."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(name).decode().splitlines()
    prefix = "Requires-Dist:"
    return [Requirement(line[len(prefix) :]) for line in lines if line.startswith(prefix)]


def _installed_by(requirements: list[Requirement], extra: str | None) -> set[str]:
    """The distributions `pip install durable-sinks[extra]` (None: the base) asks for, the
    package's own extras followed."""
    wanted: list[str | None] = [extra]
    seen: set[str | None] = set()
    names: set[str] = set()
    while wanted:
        current = wanted.pop()
        if current in seen:
            continue
        seen.add(current)
        for req in requirements:
            env = {"extra": current or ""}
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            if req.marker is None and current is not None:
                continue  # the base, already counted
            if req.name == "durable-sinks":
                wanted.extend(req.extras)
            else:
                names.add(req.name.lower())
    return names


@pytest.mark.slow
def test_the_base_install_requires_no_sink_client_and_each_extra_brings_one(wheel: Path) -> None:
    requirements = _requirements(wheel)
    base = _installed_by(requirements, None)
    assert {"pyspark", "pyarrow", "numpy"} <= base
    # pandas comes with pyspark's `sql` extra, at the floor of the pyspark installed.
    assert "pandas" not in base
    assert any(r.name == "pyspark" and "sql" in r.extras and not r.marker for r in requirements)
    assert not base & CLIENTS, sorted(base & CLIENTS)
    # The extras the sinks and stores name in their errors are the ones declared here.
    assert set(EXTRAS) == set(SINK_EXTRAS)
    for extra, clients in SINK_EXTRAS.items():
        installed = _installed_by(requirements, extra)
        assert installed == clients, (extra, sorted(installed))  # and no other sink's
    everything = set().union(*SINK_EXTRAS.values())
    assert _installed_by(requirements, "all") == everything
    # The development install keeps every client, as the test bed needs.
    assert everything <= _installed_by(requirements, "dev")


def test_extras_name_the_modules_each_client_installs() -> None:
    """core/extras.py's modules are importable here (dev has every extra) and belong to the
    distributions of their extra."""
    from importlib.metadata import packages_distributions

    owners = packages_distributions()
    for extra, modules in EXTRAS.items():
        for module in modules:
            distributions = {d.lower() for d in owners.get(module, [])}
            assert distributions, f"{module} ({extra}) is not installed"
            expected = SINK_EXTRAS[extra] | ({"botocore"} if extra == "s3" else set())
            assert distributions & expected, (module, extra, distributions)
