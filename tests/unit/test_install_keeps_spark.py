"""Installing durable-sinks never replaces the user's Spark: the wheel requires pyspark as a
range, and `pip install 'durable-sinks[postgres]'` into an environment that holds a pyspark of
that range keeps it (offline: nothing but the wheel may be fetched).

In the compatibility lane on pyspark 3.5 (tests/services/compat.py) this is the install of a
3.5 runtime; here, the main lane's pyspark.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import durable_sinks
from tests.support.venvs import build_wheel, venv_without

#: Set by tests/compat_lanes.py: the wheel it installed into the lane.
WHEEL_ENV = "DS_COMPAT_WHEEL"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get(WHEEL_ENV)
    if given:
        return Path(given)
    return build_wheel(tmp_path_factory.mktemp("clone"), tmp_path_factory.mktemp("dist"))


def _requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    return [
        Requirement(line.split(":", 1)[1]) for line in lines if line.startswith("Requires-Dist:")
    ]


def test_the_wheel_pins_no_pyspark_version(wheel: Path) -> None:
    spark = [r for r in _requirements(wheel) if r.name == "pyspark"]
    assert spark, "the wheel does not require pyspark"
    for requirement in spark:
        assert not any(s.operator in ("==", "===", "~=") for s in requirement.specifier), (
            requirement
        )
        assert requirement.specifier.contains("3.5.0"), requirement
        assert requirement.specifier.contains("4.3.0"), requirement


@pytest.mark.slow
def test_pip_install_with_the_postgres_extra_keeps_the_installed_pyspark(
    wheel: Path, tmp_path: Path
) -> None:
    import pyspark

    ours = pyspark.__version__
    # This environment without durable-sinks (its package, metadata and editable finder):
    # pyspark, psycopg, pgpq and the rest are installed there, nothing else can be fetched.
    python, left_out = venv_without(
        tmp_path / "venv",
        lambda name: name.startswith(("durable_sinks", "__editable__", "_durable_sinks")),
    )
    assert any(n.startswith("durable_sinks") for n in left_out), left_out
    done = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--no-index",
            "--find-links",
            str(wheel.parent),
            "--disable-pip-version-check",
            "durable-sinks[postgres]",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    installed = [line for line in done.stdout.splitlines() if line.startswith("Successfully")]
    expected = f"Successfully installed durable-sinks-{durable_sinks.__version__}"
    assert installed == [expected], done.stdout[-3000:]
    seen = subprocess.run(
        [
            str(python),
            "-c",
            "import pyspark, durable_sinks; print(pyspark.__version__); "
            "print(durable_sinks.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert seen[0] == ours
    assert seen[1].startswith(str(tmp_path)), seen  # the new install, not this checkout's
    assert sys.prefix not in seen[1]
