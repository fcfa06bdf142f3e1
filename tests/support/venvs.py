"""Throwaway virtualenvs: ones that see this one's dependencies but not durable-sinks itself,
and copies of this one with some distributions left out."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path


def build_wheel(clone: Path, out: Path) -> Path:
    """The wheel of this checkout as a fresh clone builds it: its files (tracked, and new ones
    not ignored) copied into the empty folder `clone`, built offline (no build isolation)
    into `out`. Returns the wheel."""
    from tests.services._layout import REPO_ROOT
    from tests.support.checkout import checkout_files

    for name in checkout_files(REPO_ROOT):
        source = REPO_ROOT / name
        if source.is_file():
            target = clone / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return wheel_of(clone, out)


def wheel_of(tree: Path, out: Path, version: str = "*") -> Path:
    """The durable-sinks wheel (of `version`) of the source tree `tree`, built offline (no
    build isolation, no dependencies) into `out`."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(tree),
        ],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob(f"durable_sinks-{version}-*.whl")
    return built


def venv_with_our_dependencies(folder: Path, *, wheels: Sequence[Path] = ()) -> Path:
    """A new virtualenv at `folder` with `wheels` installed (without their dependencies),
    whose Python then finds this one's third-party packages (pyspark, pyarrow, psycopg, ...)
    without reaching the package index: this venv's site-packages is added as a plain path,
    so the .pth files there (among them the editable install of durable-sinks) are not read.
    The wheels go in first, so pip does not take this venv's durable-sinks for theirs.
    Returns its Python."""
    command = [sys.executable, "-m", "venv", str(folder)]
    subprocess.run(command if wheels else [*command, "--without-pip"], check=True)
    python = folder / "bin" / "python"
    if wheels:
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--no-deps", *map(str, wheels)],
            check=True,
            capture_output=True,
        )
    ours = next(Path(p) for p in site.getsitepackages() if Path(p).name == "site-packages")
    (Path(purelib(python)) / "deps.pth").write_text(f"{ours}\n")
    return python


def venv_without(folder: Path, leave_out: Callable[[str], bool]) -> tuple[Path, list[str]]:
    """A new virtualenv at `folder` (no pip, no network) whose site-packages links to every
    entry of this one's except those `leave_out(name)` is true for: the packages, .dist-info
    and .libs folders of a distribution, say. The .pth files come along, among them the
    editable install of durable-sinks (a finder pointing at the link tree under build/), so
    the new venv imports this checkout's durable_sinks. Returns its Python and the names left
    out."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    ours = Path(sysconfig.get_paths()["purelib"])
    theirs = Path(purelib(python))
    left_out = []
    for entry in sorted(ours.iterdir()):
        if leave_out(entry.name):
            left_out.append(entry.name)
        elif not (theirs / entry.name).exists():
            (theirs / entry.name).symlink_to(entry)
    return python, left_out


def purelib(python: Path) -> str:
    """Where `python` installs pure-Python packages."""
    return subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
