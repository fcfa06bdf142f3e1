"""Reproduce a fresh machine's set-up here, beside whatever already runs, and run the README's
test command from it: `python -m tests.fresh_machine [--full] [--runs N]` (`make test-fresh`).

A CI run happens on a clean clone but on a machine whose caches are warm; a cold start's
failures (downloads racing, a server starting before what it needs exists) never show there.
Each run here starts from nothing the project made:

- a new temporary HOME: empty `~/.cache/durable-sinks` (the Maven-built classpaths, the test
  bed's own Maven repository, the Toxiproxy build), empty pip, Go module and build caches;
  every `DS_*`, `XDG_*`, `PIP_*`, `GO*`, `MAVEN_OPTS` and virtualenv variable of the caller
  dropped;
- a new clone of this repository with the working tree's changes on top (tracked files as
  they are now, new files not ignored; `--head` takes the last commit alone, as CI does): no
  `.venv`, no `.services`;
- the test bed on ports of its own (every port + an offset that collides with nothing the
  shared bed, its private beds or anything listening now uses), so the machine's own test bed
  keeps running;
- `CI=true`, so the servers stop at the end, as in CI.

Then it runs the README's shell blocks there, in the README's order, each command as written
(tests/support/doc_examples.py; a block marked `<!-- example: not run (why) -->` is left out,
and tests/unit/test_doc_examples.py checks that every other one is run here): `make demo` on
the bare clone, then `make test`: with `--full` the whole suite (the README's command
exactly), otherwise the same command with a smoke subset of tests (SMOKE) that starts every
server, the on-demand ones included. The first command that fails ends the run. Afterwards
the servers' data is deleted and the folder removed (`--keep` keeps it). What the machine
itself provides is not undone: Java, Maven, Go, and PostgreSQL once `apt-get` installed it.
Each run's output goes to `<folder>/run.log` and to stdout; the exit status is non-zero when
any run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TextIO

from tests.services._layout import REPO_ROOT, Layout
from tests.services._process import port_is_free
from tests.support import doc_examples
from tests.support.checkout import checkout_files
from tests.support.tiers import COMPAT_SMOKE_ENV

#: Tests that, after the README's set-up, start and use every server (the on-demand Spark
#: Connect server and Spark cluster too) and the set-up steps' own tests.
SMOKE = (
    "tests/unit/test_setup_steps.py",
    "tests/testbed/test_lifecycle.py::test_no_two_servers_share_a_port",
    "tests/testbed/test_postgres.py",
    "tests/testbed/test_kafka.py",
    "tests/testbed/test_s3.py",
    "tests/testbed/test_s3_servers.py::test_multipart_upload_round_trip",
    "tests/testbed/test_faults.py",
    "tests/testbed/test_spark.py",
    "tests/testbed/test_connect.py::test_answers_a_remote_query",
    "tests/testbed/test_connect.py::test_killable_server_down_leaves_nothing_and_up_brings_it_back",
    "tests/spark/test_cluster.py::test_an_executor_lost_mid_batch_leaves_nothing_but_the_rerun",
    "tests/spark/test_compat_lanes.py",
    "tests/spark/test_iceberg.py",
    "tests/integration/test_iceberg_sink.py::"
    "test_each_epoch_is_one_commit_with_the_epoch_property_and_summary",
)
#: The variables the test bed's ports derive from (docs/testbed.md), with their defaults.
BASE_PORTS = {
    "DS_PG_PORT": 15432,
    "DS_KAFKA_PORT": 19092,
    "DS_KAFKA_CONTROLLER_PORT": 19093,
    "DS_S3_PORT": 18333,
    "DS_S3_MASTER_PORT": 19333,
    "DS_S3_VOLUME_PORT": 18080,
    "DS_S3_FILER_PORT": 18888,
    "DS_S3_ADMIN_PORT": 13646,
    "DS_CONNECT_PORT": 15602,
    "DS_SPARK_MASTER_PORT": 17077,
    "DS_KAFKA_CLUSTER_PORT": 19492,
}
#: Offsets tried in turn; the first whose ports collide with nothing is taken.
OFFSETS = (2000, 2500, 1500, 3000, 2200, 1700)
#: The private beds some tests start (tests/testbed): their ports must be free too.
PRIVATE_OFFSETS = (0, 200, 400)
#: Ports at or above this are the kernel's ephemeral range.
EPHEMERAL = 32768
#: Variables of the caller that would let a run use what the machine already made.
_DROPPED_PREFIXES = ("DS_", "XDG_", "PIP_", "GO", "PYSPARK_", "SPARK_", "CONDA_")
_DROPPED = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "MAVEN_OPTS", "CI", "HOME")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fresh_machine", description=__doc__)
    parser.add_argument("--full", action="store_true", help="the whole suite, not SMOKE")
    parser.add_argument("--runs", type=int, default=1, help="runs, each from empty caches")
    parser.add_argument("--head", action="store_true", help="the last commit, not the tree")
    parser.add_argument("--offset", type=int, help="port offset (default: the first free)")
    parser.add_argument("--keep", action="store_true", help="keep each run's folder")
    parser.add_argument("--dir", type=Path, help="where the runs' folders go (default: /tmp)")
    parser.add_argument(
        "--pytest-args", default="", help="replace SMOKE (or add to the full suite's options)"
    )
    args = parser.parse_args(argv)

    results = []
    for run in range(1, args.runs + 1):
        offset = args.offset if args.offset is not None else free_offset()
        root = Path(tempfile.mkdtemp(prefix="ds-fresh-", dir=args.dir))
        print(f"== run {run}/{args.runs}: {root}, ports + {offset}", flush=True)
        started = time.monotonic()
        status = run_once(root, offset, full=args.full, head=args.head, extra=args.pytest_args)
        minutes = (time.monotonic() - started) / 60
        verdict = "passed" if status == 0 else f"FAILED (exit {status}, log {root / 'run.log'})"
        results.append((run, verdict, minutes))
        print(f"== run {run}/{args.runs}: {verdict} in {minutes:.1f} min", flush=True)
        if not args.keep and status == 0:
            shutil.rmtree(root, ignore_errors=True)
    print("\n".join(f"run {n}: {verdict}, {m:.1f} min" for n, verdict, m in results))
    return 0 if all(verdict == "passed" for _, verdict, _ in results) else 1


def run_once(root: Path, offset: int, *, full: bool, head: bool, extra: str) -> int:
    """One fresh-machine run in `root`; its exit status."""
    checkout, home = root / "checkout", root / "home"
    home.mkdir(parents=True)
    clone(checkout, with_working_tree=not head)
    env = fresh_environment(home, offset)
    pytest_args = extra if full else (extra or " ".join(SMOKE))
    with (root / "run.log").open("w") as log:
        status = 0
        for command in readme_commands():
            if command == "make test":
                argv = ["make", "--no-print-directory", "test", f"PYTEST_ARGS={pytest_args}"]
            else:
                argv = ["bash", "-euo", "pipefail", "-c", command]
            print(f"== README: {command}", flush=True)
            log.write(f"== README: {command}\n")
            status = _tee(argv, cwd=checkout, env=env, log=log)
            if status != 0:
                break
        # Delete the servers' data (a Postgres cluster may live under /var/tmp); with CI set,
        # `make test` has already stopped them.
        venv_python = checkout / ".venv" / "bin" / "python"
        if venv_python.exists():
            _tee(
                [str(venv_python), "-m", "tests.services", "reset"], cwd=checkout, env=env, log=log
            )
    return status


def readme_commands() -> list[str]:
    """The commands of the README's shell blocks that are not marked as not run, in order."""
    return [
        command
        for block in doc_examples.shell_blocks()
        if block.runs
        for command in doc_examples.shell_commands(block)
    ]


def clone(target: Path, *, with_working_tree: bool) -> None:
    """A clone of this repository's last commit at `target`, with the working tree's changes
    (modified, deleted and new files not ignored) on top when asked."""
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(REPO_ROOT), str(target)], check=True
    )
    if not with_working_tree:
        return
    for name in checkout_files(REPO_ROOT):
        source, copy = REPO_ROOT / name, target / name
        if source.is_file():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy)
        elif copy.exists():
            copy.unlink()  # deleted in the working tree
    # Files deleted from the tree but still in the last commit are not listed by `--others`.
    tracked = subprocess.run(
        ["git", "ls-files", "--deleted", "-z"], cwd=REPO_ROOT, check=True, capture_output=True
    ).stdout.decode()
    for name in filter(None, tracked.split("\0")):
        (target / name).unlink(missing_ok=True)


def fresh_environment(home: Path, offset: int) -> dict[str, str]:
    """The caller's environment without anything pointing at what the machine made, with a new
    HOME and the test bed's ports moved by `offset`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _DROPPED and not key.startswith(_DROPPED_PREFIXES)
    }
    venv = os.environ.get("VIRTUAL_ENV") or (sys.prefix if sys.prefix != sys.base_prefix else "")
    if venv:  # the caller's virtualenv must not be the fresh checkout's python3
        env["PATH"] = os.pathsep.join(
            p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(venv)
        )
    # The compatibility lanes' smoke subset too: a fresh machine builds the lanes.
    env.update(HOME=str(home), CI="true", **port_environment(offset), **{COMPAT_SMOKE_ENV: "1"})
    return env


def port_environment(offset: int) -> dict[str, str]:
    return {name: str(port + offset) for name, port in BASE_PORTS.items()}


def layout_of(env: Mapping[str, str]) -> Layout:
    with _environment(env):
        return Layout.from_env()


def wanted_ports(layout: Layout) -> set[int]:
    """Every port the layout's servers and the private beds of its tests may listen on."""
    ports: set[int] = set()
    for extra in PRIVATE_OFFSETS:
        shifted = layout.shifted(extra, layout.root) if extra else layout
        ports |= set(shifted.ports().values())
    return ports


def free_offset() -> int:
    """The first of OFFSETS whose ports the shared bed (as this environment sets it) does not
    want, that stay below the ephemeral range and that nothing listens on now."""
    shared = wanted_ports(Layout.from_env())
    for offset in OFFSETS:
        ours = wanted_ports(layout_of(port_environment(offset)))
        if ours & shared or max(ours) >= EPHEMERAL:
            continue
        if all(port_is_free(port) for port in ours):
            return offset
    raise SystemExit(f"no port offset of {OFFSETS} is free here: give one with --offset")


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _tee(command: list[str], *, cwd: Path, env: Mapping[str, str], log: TextIO) -> int:
    """Run `command`, its output to stdout and to `log` line by line; its exit status."""
    with subprocess.Popen(
        command,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        sys.stdout.flush()
        return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
