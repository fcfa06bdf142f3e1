"""The files of this repository's checkout as git sees them."""

from __future__ import annotations

import subprocess
from pathlib import Path


def checkout_files(root: Path) -> list[str]:
    """The names (relative to `root`) of the files a clone of `root` with its working tree's
    changes on top has: tracked ones and new ones git does not ignore. A tracked file deleted
    from the working tree is still named; callers check that it exists."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return sorted({name for name in listed.split("\0") if name})
