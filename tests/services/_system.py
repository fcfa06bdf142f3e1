"""Debian packages the test bed needs from the machine (Java, Maven, PostgreSQL), installed
with apt-get when missing and we are root; otherwise a clear error saying what to install."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ._process import ServiceError, run
from ._steps import step_lock

#: Services start in parallel threads and processes; dpkg takes one install at a time (and
#: refuses, rather than waits, when another holds its lock).
_APT_LOCK = Path(tempfile.gettempdir()) / "durable-sinks-apt.lock"
_apt_updated = False
#: ... and apt run by anything else on the machine (unattended upgrades): wait for it.
_WAIT_FOR_DPKG = ("-o", "DPkg::Lock::Timeout=600")


def apt_install(service: str, packages: list[str], why: str) -> None:
    """Install Debian packages, or raise naming them when we cannot."""
    global _apt_updated
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ServiceError(
            service,
            f"{why}. Install it once with `sudo apt-get install -y {' '.join(packages)}` "
            "and try again.",
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with step_lock(service, f"apt-get install {' '.join(packages)}", _APT_LOCK):
        if not _apt_updated:
            run(service, ["apt-get", *_WAIT_FOR_DPKG, "update"], timeout=600, env=env)
            _apt_updated = True
        run(
            service,
            ["apt-get", *_WAIT_FOR_DPKG, "install", "-y", "--no-install-recommends", *packages],
            timeout=900,
            env=env,
        )


def require_command(service: str, command: str, package: str) -> None:
    """Make sure `command` is on PATH, installing Debian's `package` if it is not."""
    if shutil.which(command) is None:
        apt_install(service, [package], f"`{command}` is not installed")
    if shutil.which(command) is None:
        raise ServiceError(service, f"installed {package} but `{command}` is still not on PATH")
