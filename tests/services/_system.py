"""Debian packages the test bed needs from the machine (Java, Maven, PostgreSQL), installed
with apt-get when missing and we are root; otherwise a clear error saying what to install."""

from __future__ import annotations

import os
import shutil
import threading

from ._process import ServiceError, run

_apt_lock = threading.Lock()  # services start in parallel; dpkg takes one install at a time
_apt_updated = False


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
    with _apt_lock:
        if not _apt_updated:
            run(service, ["apt-get", "update"], timeout=600, env=env)
            _apt_updated = True
        run(
            service,
            ["apt-get", "install", "-y", "--no-install-recommends", *packages],
            timeout=900,
            env=env,
        )


def require_command(service: str, command: str, package: str) -> None:
    """Make sure `command` is on PATH, installing Debian's `package` if it is not."""
    if shutil.which(command) is None:
        apt_install(service, [package], f"`{command}` is not installed")
    if shutil.which(command) is None:
        raise ServiceError(service, f"installed {package} but `{command}` is still not on PATH")
