"""Classpath folders built from Maven Central by a throwaway pom, cached between runs."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

from ._process import ServiceError, run
from ._steps import ensure_folder, is_complete, step_lock
from ._system import require_command

POM_DIR = Path(__file__).resolve().parent / "maven"


def repository(cache: Path) -> Path:
    """The test bed's own Maven repository (`-Dmaven.repo.local`), under the cache folder.

    Its own, not the user's `~/.m2`: Maven 3.8 does not guard a local repository against two
    builds writing the same artifact at once ("Failed to copy full contents from ..." seen on
    a fresh machine when the broker's and Spark's jars were resolved together), and other
    builds on the machine would not take our lock. Emptying the cache folder also empties
    this, so a fresh machine is one empty folder (Java's `user.home`, where `~/.m2` lives,
    ignores `$HOME`).
    """
    return cache / "maven" / "repository"


def classpath(service: str, pom_name: str, cache: Path) -> Path:
    """A folder holding the runtime jars of `maven/<pom_name>`, built once per pom content.

    A set-up step (tests/services/_steps.py): one build at a time, published by rename with
    its marker only after Maven succeeded. Every Maven run of the test bed also holds the
    repository's lock, so two poms sharing artifacts (zstd-jni, kafka-clients, ...) never
    download into the repository at once.
    """
    pom = POM_DIR / pom_name
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    target = cache / "maven" / f"{pom.stem}-{digest}"
    if is_complete(target):
        return target

    def build(staging: Path) -> None:
        require_java(service)
        require_command(service, "mvn", "maven")
        repo = repository(cache)
        with step_lock(service, "the Maven repository", repo.parent / ".repository.lock"):
            run(
                service,
                [
                    "mvn",
                    "-B",
                    "-q",
                    f"-Dmaven.repo.local={repo}",
                    "-f",
                    str(pom),
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={staging}",
                    "-DincludeScope=runtime",
                ],
                timeout=900,
                fix="Maven must reach Maven Central; the output below names what failed.",
            )
        if not any(staging.glob("*.jar")):
            raise ServiceError(service, f"Maven copied no jar for {pom_name}")
        (staging / pom.name).write_text(pom.read_text())

    return ensure_folder(service, f"Maven classpath {pom_name}", target, build)


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
