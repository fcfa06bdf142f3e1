"""Classpath folders built from Maven Central by a throwaway pom, cached between runs."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from ._process import ServiceError, run
from ._system import require_command

POM_DIR = Path(__file__).resolve().parent / "maven"
_COMPLETE = ".complete"


def classpath(service: str, pom_name: str, cache: Path) -> Path:
    """A folder holding the runtime jars of `maven/<pom_name>`, built once per pom content.

    The folder is published by rename only after Maven succeeded, so an interrupted download
    never passes for a complete one. Maven's own repository (~/.m2) caches the downloads too.
    """
    pom = POM_DIR / pom_name
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    target = cache / "maven" / f"{pom.stem}-{digest}"
    if (target / _COMPLETE).exists():
        return target
    require_java(service)
    require_command(service, "mvn", "maven")
    staging = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    run(
        service,
        [
            "mvn",
            "-B",
            "-q",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
        ],
        timeout=900,
        fix="Maven must reach Maven Central; the output above names what failed.",
    )
    (staging / _COMPLETE).write_text(pom.read_text())
    try:
        staging.rename(target)
    except OSError:
        # Another process published the same folder first; theirs is as good as ours.
        shutil.rmtree(staging, ignore_errors=True)
    return target


def java_major_version() -> int | None:
    """The major version of `java` on PATH, or None when there is no java."""
    try:
        done = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def require_java(service: str, minimum: int = 17) -> int:
    if java_major_version() is None:
        require_command(service, "java", "openjdk-17-jre-headless")
    version = java_major_version()
    if version is None:
        raise ServiceError(service, "`java` is on PATH but `java -version` names no version")
    if version < minimum:
        raise ServiceError(
            service,
            f"`java` on PATH is Java {version}; Java {minimum} or newer is needed. Put a newer "
            "JDK first on PATH or set JAVA_HOME.",
        )
    return version
