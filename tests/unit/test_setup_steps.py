"""Set-up steps of the test bed (tests/services/_steps.py): built once whoever races for them,
published whole or not at all, and a failure names the step and its cause."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.services import _maven
from tests.services._steps import (
    COMPLETE,
    SetupStepError,
    ensure_folder,
    is_complete,
    publish_file,
    step_lock,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

#: A process that builds `target` (argv[1]) as step "demo": appends its pid to argv[2], writes
#: a part, signals with argv[3] that it is inside the build, sleeps argv[4] seconds, then
#: writes the rest.
BUILDER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from tests.services._steps import ensure_folder

    target, log, inside = (Path(a) for a in sys.argv[1:4])
    pause = float(sys.argv[4])

    def build(staging):
        with log.open("a") as f:
            f.write(f"{os.getpid()}\\n")
        (staging / "part-1").write_text("one")
        inside.touch()
        time.sleep(pause)
        (staging / "part-2").write_text("two")

    ensure_folder("demo-service", "demo", target, build)
    print("done", flush=True)
    """
)


def start_builder(target: Path, log: Path, inside: Path, pause: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", BUILDER, str(target), str(log), str(inside), str(pause)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.02)


def test_threads_racing_for_a_step_build_it_once(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "thing"
    builds: list[int] = []
    results: list[Path] = []
    errors: list[Exception] = []
    start = threading.Barrier(8)

    def build(staging: Path) -> None:
        builds.append(threading.get_ident())
        time.sleep(0.3)
        (staging / "payload").write_text("whole")

    def racer() -> None:
        start.wait()
        try:
            results.append(ensure_folder("svc", "thing", target, build))
        except Exception as exc:  # noqa: BLE001 (collected, asserted empty below)
            errors.append(exc)

    threads = [threading.Thread(target=racer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert len(builds) == 1
    assert results == [target] * 8
    assert (target / "payload").read_text() == "whole"
    assert is_complete(target)
    assert sorted(p.name for p in target.parent.iterdir()) == [".thing.lock", "thing"]


def test_processes_racing_for_a_step_build_it_once(tmp_path: Path) -> None:
    target, log = tmp_path / "thing", tmp_path / "builds.log"
    racers = [start_builder(target, log, tmp_path / f"inside-{i}", 0.5) for i in range(4)]
    outputs = [r.communicate(timeout=120) for r in racers]

    assert [r.returncode for r in racers] == [0] * 4, outputs
    assert len(log.read_text().split()) == 1  # one process built, three took its result
    assert (target / "part-1").read_text() == "one"
    assert (target / "part-2").read_text() == "two"
    assert is_complete(target)


def test_a_build_killed_half_way_leaves_nothing_trusted(tmp_path: Path) -> None:
    target, log, inside = tmp_path / "thing", tmp_path / "builds.log", tmp_path / "inside"
    victim = start_builder(target, log, inside, 600)
    wait_for(inside)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)

    assert not target.exists()  # half a build is never published
    assert [p.name for p in tmp_path.glob(".thing.partial-*")] != []

    # The kernel dropped the dead builder's lock: the next caller builds again, at once.
    rebuilt = ensure_folder(
        "svc", "demo", target, lambda staging: (staging / "part-1").write_text("again")
    )
    assert rebuilt == target
    assert (target / "part-1").read_text() == "again"
    assert not (target / "part-2").exists()
    assert list(tmp_path.glob(".thing.partial-*")) == []  # the dead build's folder is gone


def test_an_incomplete_target_is_rebuilt(tmp_path: Path) -> None:
    """A folder without the marker (say, copied in by hand and cut short) is not trusted."""
    target = tmp_path / "thing"
    target.mkdir()
    (target / "stale").write_text("?")
    ensure_folder("svc", "thing", target, lambda staging: (staging / "fresh").write_text("!"))
    assert sorted(p.name for p in target.iterdir()) == [COMPLETE, "fresh"]


def test_a_failing_build_names_the_step_and_its_cause_and_publishes_nothing(
    tmp_path: Path,
) -> None:
    target = tmp_path / "thing"
    missing = tmp_path / "no-such-input"

    def build(staging: Path) -> None:
        (staging / "half").write_text("written before the failure")
        missing.read_text()

    with pytest.raises(SetupStepError) as caught:
        ensure_folder("faults-kafka", "Maven classpath kafka.xml", target, build)
    message = str(caught.value)
    assert message.startswith("faults-kafka: set-up step 'Maven classpath kafka.xml' failed")
    assert "FileNotFoundError" in message
    assert str(missing) in message
    assert caught.value.step == "Maven classpath kafka.xml"
    assert not target.exists()
    assert list(tmp_path.glob(".thing.partial-*")) == []

    # The next call builds again.
    ensure_folder("svc", "thing", target, lambda staging: (staging / "ok").write_text("ok"))
    assert (target / "ok").read_text() == "ok"


def test_the_error_pickles(tmp_path: Path) -> None:
    import pickle

    error = SetupStepError("kafka", "step", "cause")
    again = pickle.loads(pickle.dumps(error))  # noqa: S301 (our own bytes)
    assert (again.service, again.step, again.cause, str(again)) == (
        "kafka",
        "step",
        "cause",
        str(error),
    )


def test_a_waiter_gives_up_naming_the_holder(tmp_path: Path) -> None:
    lock = tmp_path / ".thing.lock"
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with step_lock("svc", "thing", lock):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        held.wait(10)
        with pytest.raises(SetupStepError) as caught:
            ensure_folder("connect", "thing", tmp_path / "thing", lambda s: None, wait_timeout=0.5)
        assert f"pid {os.getpid()} (thing)" in str(caught.value)
        assert str(lock) in str(caught.value)
    finally:
        release.set()
        thread.join()


def test_maven_runs_one_at_a_time_into_the_test_beds_own_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two poms sharing artifacts resolved at once (the broker's and Spark's extra jars)
    broke a fresh machine's local repository: every Maven run holds the repository's lock.
    `mvn` here is a stand-in that records when it ran and with which repository."""
    bin_dir, runs = tmp_path / "bin", tmp_path / "runs.log"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import sys, time
            args = sys.argv[1:]
            out = next(a.split("=", 1)[1] for a in args if a.startswith("-DoutputDirectory="))
            repo = next(a.split("=", 1)[1] for a in args if a.startswith("-Dmaven.repo.local="))
            started = time.monotonic()
            time.sleep(0.4)
            open(out + "/lib.jar", "w").write("jar")
            with open({str(runs)!r}, "a") as f:
                f.write(f"{{started}} {{time.monotonic()}} {{repo}}\\n")
            """
        )
    )
    mvn.chmod(mvn.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    cache = tmp_path / "cache"
    folders: dict[str, Path] = {}

    def resolve(pom: str) -> None:
        folders[pom] = _maven.classpath(pom, pom, cache)

    threads = [
        threading.Thread(target=resolve, args=(p,)) for p in ("kafka.xml", "spark-extras.xml")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    spans = sorted(
        (float(a), float(b), repo)
        for a, b, repo in (line.split() for line in runs.read_text().splitlines())
    )
    assert len(spans) == 2
    assert spans[0][1] <= spans[1][0], "two Maven runs overlapped"
    assert {repo for _, _, repo in spans} == {str(_maven.repository(cache))}
    for pom, folder in folders.items():
        assert is_complete(folder)
        assert (folder / "lib.jar").exists()
        assert (folder / pom).read_text() == (_maven.POM_DIR / pom).read_text()


def test_a_failing_maven_run_names_its_pom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text("#!/bin/sh\necho 'Could not transfer artifact x:y:1 from central' >&2\nexit 1\n")
    mvn.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(SetupStepError) as caught:
        _maven.classpath("kafka", "kafka.xml", tmp_path / "cache")
    message = str(caught.value)
    assert message.startswith("kafka: set-up step 'Maven classpath kafka.xml' failed")
    assert "Could not transfer artifact x:y:1" in message
    assert not any((tmp_path / "cache" / "maven").glob("kafka-*"))


def test_a_small_file_is_published_whole_once(tmp_path: Path) -> None:
    """Credentials and the like: the first writer wins, everyone reads what it wrote, and a
    name is never half-written (a writer killed half-way left an empty credentials file that
    every later start failed to parse)."""
    target = tmp_path / "credentials.json"
    read: list[str] = []
    start = threading.Barrier(6)

    def publish(n: int) -> None:
        start.wait()
        read.append(publish_file(target, f"writer {n}\n" * 1000, mode=0o600))

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(read)) == 1
    assert target.read_text() == read[0]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["credentials.json"]
    assert publish_file(target, "later") == read[0]  # an existing file is kept
