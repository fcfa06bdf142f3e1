"""The layer contracts (pyproject.toml, `[tool.importlinter]`, run by `make lint`) hold for the
package, and they bite: a copy of the package with one import that points the wrong way
breaks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import durable_sinks

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_package_keeps_every_contract(tmp_path: Path) -> None:
    done = lint_imports(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "wrong_import", "contract"),
    [
        # A decision store that loads a sink (and through it pgpq): layers.
        ("manifest/_store.py", "import durable_sinks.sinks.postgres", "layers"),
        # The foundation reaching up into the coordinator: layers.
        ("core/naming.py", "import durable_sinks.coordinator", "layers"),
        # A client reaching up into a decision store, and the foundation into a client.
        ("clients/s3.py", "import durable_sinks.manifest", "layers"),
        ("core/errors.py", "import durable_sinks.clients.postgres", "layers"),
        # The coordinator naming a particular sink.
        ("coordinator/validation.py", "import durable_sinks.sinks.kafka", "knows no particular"),
        # One sink using another's internals.
        ("sinks/kafka/records.py", "import durable_sinks.sinks.postgres.columns", "stands alone"),
        # Spark below the Spark layer.
        ("sinks/folder/sink.py", "import pyspark", "only the Spark layer"),
        # A repository folder used as an import name.
        ("spark/_specs.py", "import sinks", "not import names"),
    ],
)
def test_a_wrong_import_in_a_copy_breaks_its_contract(
    tmp_path: Path, module: str, wrong_import: str, contract: str
) -> None:
    copy = tmp_path / "durable_sinks"
    shutil.copytree(Path(durable_sinks.__file__).parent, copy, symlinks=False)
    target = copy / module
    target.write_text(target.read_text() + f"\n{wrong_import}  # deliberately wrong\n")
    done = lint_imports(tmp_path, pythonpath=tmp_path)
    assert done.returncode != 0, done.stdout[-3000:]
    broken = [line for line in done.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(contract in line for line in broken), done.stdout[-3000:]
