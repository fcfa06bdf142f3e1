"""The previous release of durable-sinks, built from this repository's history: its version
and commit (tests/upgrade/previous_release.toml), its wheel (`git archive` of that commit,
built offline), and a virtualenv that runs it with this one's pinned dependencies."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tests.services._layout import REPO_ROOT
from tests.support.venvs import venv_with_our_dependencies, wheel_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

RECORD = REPO_ROOT / "tests" / "upgrade" / "previous_release.toml"


@dataclass(frozen=True)
class Release:
    version: str
    commit: str


def previous_release() -> Release:
    """The release recorded in tests/upgrade/previous_release.toml."""
    data = tomllib.loads(RECORD.read_text())["previous"]
    return Release(str(data["version"]), str(data["commit"]))


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, check=False)


def require_history(release: Release) -> None:
    """AssertionError naming the fix unless this checkout holds `release`'s commit (a shallow
    clone does not)."""
    if _git("cat-file", "-e", f"{release.commit}^{{commit}}").returncode == 0:
        return
    shallow = _git("rev-parse", "--is-shallow-repository").stdout.decode().strip() == "true"
    raise AssertionError(
        f"release {release.version} (commit {release.commit}, {RECORD.name}) is not in this "
        f"checkout's history{' (a shallow clone)' if shallow else ''}: the upgrade test "
        "builds it from there. Fix: "
        + ("`git fetch --unshallow`" if shallow else "`git fetch` the commit (or the branch)")
        + ", or clone without --depth"
    )


def build_release_wheel(release: Release, folder: Path) -> Path:
    """The wheel of `release`, built from its commit's tree (`git archive`) in `folder`,
    offline (no build isolation, no dependencies)."""
    require_history(release)
    tree, out = folder / "tree", folder / "wheel"
    tree.mkdir(parents=True)
    archive = _git("archive", "--format=tar", release.commit)
    assert archive.returncode == 0, archive.stderr.decode()
    tar = folder / "release.tar"
    tar.write_bytes(archive.stdout)
    with tarfile.open(tar) as opened:
        opened.extractall(tree, filter="data")
    return wheel_of(tree, out, release.version)


def release_python(release: Release, folder: Path) -> Path:
    """A virtualenv at `folder` with `release` installed and this one's third-party packages
    (tests/constraints.txt's pins) beside it; returns its Python."""
    wheel = build_release_wheel(release, folder / "build")
    return venv_with_our_dependencies(folder / "venv", wheels=[wheel])
