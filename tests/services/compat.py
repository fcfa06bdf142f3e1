"""The compatibility lanes: virtualenvs with the oldest and the newest supported pyspark, each on
its own Python, in which `make test-compat` (tests/compat_lanes.py) runs the Spark tests.

    oldest: Python 3.10, pyspark 3.5.0 (no Python Data Source API; Connect's server jar from
            Maven Central, maven/spark-compat-3.5.xml), pandas 1.5.3, numpy 1.23.5
    newest: Python 3.13, pyspark 4.3.0

and the managed runtime (MANAGED): Python 3.10 with pyspark 3.5.0, pandas 1.5.3 and numpy
1.23.5 installed before durable-sinks, whose install must keep them (the oldest lane pins
the same pandas and numpy).

`up` builds each lane's virtualenv once (a set-up step, tests/services/_steps.py) under
`<cache>/compat/<lane>-<digest>`, the digest covering the lane, its install recipe and
pyproject.toml's requirements (a change of dependencies builds a new one; older ones are
deleted): the interpreter from pyenv (or PATH), pip upgraded, then the checkout with its dev
extras and the lane's pins. The package in it is replaced by the checkout's wheel at every
lane run, without its dependencies (`install_wheel`), so the lanes test the code as it is,
installed as users install it. Nothing runs between runs: `down` has nothing to stop.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from ._layout import REPO_ROOT, Layout
from ._process import ServiceError, run
from ._service import Status, remove_tree
from ._steps import ensure_folder, is_complete

NAME = "compat"
#: pip's own timeout per request, and the whole install's (pyspark's sdist is ~300-450 MB).
INSTALL_TIMEOUT = 1800.0


@dataclass(frozen=True)
class Lane:
    """One compatibility lane: an interpreter version and the pyspark installed with it."""

    name: str
    python: str
    pyspark: str
    #: Pins besides pyspark's, each with its reason in LANES.
    pins: tuple[str, ...] = ()
    #: Tests that need what this pyspark lacks (tests/compat_lanes.py deselects them; what
    #: the lane does instead is tested, e.g. the data source's ConfigError on 3.5).
    lacks: tuple[str, ...] = ()

    def describe(self) -> str:
        pins = "".join(f", {p.replace('==', ' ')}" for p in self.pins)
        return f"Python {self.python}, pyspark {self.pyspark}{pins}"


@dataclass(frozen=True)
class ManagedRuntime:
    """The Python of a managed Spark runtime, into which users pip-install durable-sinks: an
    interpreter version and the packages the runtime ships. Not a lane's virtualenv: its test
    (tests/unit/test_install_keeps_pandas.py) builds a fresh one each run, from pip's cache."""

    name: str
    python: str
    #: Installed first, as the runtime ships them; the install of durable-sinks keeps them.
    packages: tuple[str, ...]

    def describe(self) -> str:
        return f"Python {self.python}, " + ", ".join(p.replace("==", " ") for p in self.packages)


#: The versions of a managed runtime with Spark 3.5.0 (Databricks Runtime 14.3 LTS's): pandas
#: 1.5.3, built against numpy 1 (it does not import with numpy 2). The runtime's pyarrow (8.0.0
#: there) is left out: durable-sinks needs pyarrow >= 17, which pip installs in its place.
MANAGED = ManagedRuntime("managed", "3.10", ("pyspark==3.5.0", "pandas==1.5.3", "numpy==1.23.5"))

#: pyspark 3.5 has no Python Data Source API: `format("durable")` is refused there.
NO_DATA_SOURCE = (
    "tests/spark/test_datasource.py::test_postgres_and_files_through_the_data_source_exactly_once_across_a_restart",
    "tests/spark/test_datasource.py::test_one_sink_by_kind_and_string_options",
    "tests/spark/test_datasource.py::test_kafka_through_the_data_source_is_refused_with_the_reason",
    "tests/spark/test_datasource.py::test_spark_shows_no_option_of_a_durable_query",
    "tests/spark/test_datasource.py::test_a_new_checkpoint_in_a_new_application_is_refused_not_a_key_collision",
    "tests/spark/test_connect.py::test_the_durable_data_source_writes_through_a_remote_session",
    "tests/spark/test_progress.py::test_the_data_source_s_rows_are_counted_by_spark_in_the_sink_s_progress",
)
LANES = (
    # The managed runtime's pandas and numpy: the Spark tests on the oldest pandas tested.
    Lane(
        "oldest",
        "3.10",
        "3.5.0",
        pins=tuple(p for p in MANAGED.packages if not p.startswith("pyspark==")),
        lacks=NO_DATA_SOURCE,
    ),
    Lane("newest", "3.13", "4.3.0"),
)
#: What a lane installs from the checkout (the tests import what the dev extras bring).
EXTRAS = "dev"
#: Raise it when `_build` changes: the lanes' virtualenvs are built again.
RECIPE = 1


def lane(name: str) -> Lane:
    for candidate in LANES:
        if candidate.name == name:
            return candidate
    raise ValueError(f"no compatibility lane {name!r}; lanes: {[x.name for x in LANES]}")


def find_python(version: str) -> Path:
    """The interpreter of Python `version` ("3.10"): in pyenv's versions (PYENV_ROOT, else the
    account's own ~/.pyenv, whatever HOME says), else on PATH as `python3.10` (not a pyenv
    shim, which runs only the globally selected versions)."""
    command = f"python{version}"
    roots = [Path(os.environ["PYENV_ROOT"])] if os.environ.get("PYENV_ROOT") else []
    roots.append(Path(pwd.getpwuid(os.getuid()).pw_dir) / ".pyenv")
    for root in roots:
        for candidate in sorted((root / "versions").glob(f"{version}.*/bin/{command}")):
            if candidate.is_file():
                return candidate
    path = os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep) if "shims" not in Path(d).parts
    )
    found = shutil.which(command, path=path)
    if found:
        return Path(found)
    raise ServiceError(
        NAME,
        f"no Python {version} interpreter: not in pyenv's versions under "
        f"{', '.join(str(r) for r in roots)}, not on PATH as {command}: install it "
        f"(`pyenv install {version}`, or the distribution's python{version} package with its "
        "venv module)",
    )


class CompatLanes:
    """The lanes' virtualenvs, as a service of the test bed (`python -m tests.services up
    compat`)."""

    name = NAME

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.root = layout.cache / "compat"

    def folder(self, chosen: Lane) -> Path:
        """Where `chosen`'s virtualenv lives (its digest names what it was built from)."""
        digest = hashlib.sha256(
            "\n".join(
                [
                    repr((chosen.name, chosen.python, chosen.pyspark, chosen.pins)),
                    EXTRAS,
                    str(RECIPE),
                    _dependencies(),
                ]
            ).encode()
        ).hexdigest()[:16]
        return self.root / f"{chosen.name}-{digest}"

    def python(self, chosen: Lane) -> Path:
        """The lane's interpreter (its virtualenv's `bin/python`), built if need be."""
        return self.ensure(chosen) / "bin" / "python"

    def ensure(self, chosen: Lane) -> Path:
        target = self.folder(chosen)
        ensure_folder(
            NAME,
            f"the {chosen.name} lane's virtualenv ({chosen.describe()})",
            target,
            lambda staging: self._build(chosen, staging),
            wait_timeout=INSTALL_TIMEOUT,
        )
        for other in self.root.glob(f"{chosen.name}-*"):
            if other != target and other.is_dir():
                shutil.rmtree(other, ignore_errors=True)  # built from older dependencies
        return target

    def _build(self, chosen: Lane, staging: Path) -> None:
        interpreter = find_python(chosen.python)
        _run([str(interpreter), "-m", "venv", str(staging)], f"creating the {chosen.name} venv")
        python = str(staging / "bin" / "python")
        pip = [python, "-m", "pip", "--disable-pip-version-check", "--no-input"]
        _run([*pip, "install", "--quiet", "--upgrade", "pip", "setuptools", "wheel"], "pip")
        constraints = staging / "constraints.txt"
        constraints.write_text("\n".join([f"pyspark=={chosen.pyspark}", *chosen.pins]) + "\n")
        _run(
            [
                *pip,
                "install",
                "--quiet",
                f"{REPO_ROOT}[{EXTRAS}]",
                "-c",
                str(constraints),
            ],
            f"installing durable-sinks[{EXTRAS}] with pyspark {chosen.pyspark}",
        )

    # -- the Service protocol ---------------------------------------------------------------

    def up(self) -> None:
        with ThreadPoolExecutor(len(LANES)) as pool:
            for done in [pool.submit(self.ensure, chosen) for chosen in LANES]:
                done.result()

    def down(self) -> None:
        """Nothing runs between lane runs."""

    def reset(self) -> None:
        remove_tree(self.root)

    def status(self) -> Status:
        ready = [c for c in LANES if is_complete(self.folder(c))]
        detail = "; ".join(
            f"{c.name}: {c.describe()} ({'ready' if c in ready else 'not built'})" for c in LANES
        )
        return Status(NAME, len(ready) == len(LANES), None, detail, ())


def _dependencies() -> str:
    """pyproject.toml's requirements (what a change of would need a new virtualenv), as text."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return json.dumps(
        [project["requires-python"], project["dependencies"], project["optional-dependencies"]],
        sort_keys=True,
    )


def install_wheel(python: Path, wheel: Path) -> None:
    """Replace the durable-sinks in `python`'s environment by `wheel`, dependencies untouched
    (offline)."""
    _run(
        [
            str(python),
            "-m",
            "pip",
            "--disable-pip-version-check",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
            str(wheel),
        ],
        f"installing {wheel.name} into {python.parent.parent.name}",
    )


def _run(argv: Sequence[str], what: str) -> None:
    """A set-up command of the lanes (_process.run: ServiceError with its output's tail)."""
    run(
        NAME,
        argv,
        timeout=INSTALL_TIMEOUT,
        fix=f"({what}; pip must reach the package index: the output names what failed)",
    )
