"""Run one test (any pytest selection) many times in a row beside a CPU load, to find why it
fails now and then (`make test-repeat T=... N=20`; docs/testing.md, "A flaky test").

    python -m tests.repeat [--count N] [--load L] [--keep DIR] SELECTION... [PYTEST_OPTIONS]

Each run is a pytest session of its own (fixtures, servers' sessions and the test's unique
names are new every time, as in separate CI runs); `--load L` keeps L processes spinning on
the CPU meanwhile (1 by default: the second xdist worker's share of a 2-core machine; 0 for
a quiet machine). Every run goes on whatever the previous one did; each prints one line
(`run 7/20: passed in 12.3 s`), a failed run's whole output is kept in DIR, and the summary
gives the failures and the times. Exits non-zero if any run failed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.services._layout import REPO_ROOT


def _spin() -> None:  # pragma: no cover - runs in a child process
    while True:
        pass


@contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """`processes` busy processes (the load an xdist worker beside the test would make)."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(processes)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.repeat", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--count", type=int, default=20, help="runs (default 20)")
    parser.add_argument("--load", type=int, default=1, help="busy processes beside (default 1)")
    parser.add_argument("--keep", type=Path, help="where failed runs' output goes")
    parser.add_argument("selection", nargs="*", help="pytest node ids or paths, and options")
    args, options = parser.parse_known_args(argv)
    if not args.selection:
        parser.error("name the test: make test-repeat T=tests/...::test_name")
    keep = args.keep or Path(tempfile.mkdtemp(prefix="ds-repeat-"))
    keep.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    command += [*args.selection, *options]
    failed: list[int] = []
    times: list[float] = []
    print(f"== {args.count} runs of {' '.join(args.selection)}, {args.load} busy", flush=True)
    with cpu_load(args.load):
        for run in range(1, args.count + 1):
            started = time.monotonic()
            done = subprocess.run(
                command, cwd=REPO_ROOT, capture_output=True, text=True, check=False
            )
            seconds = time.monotonic() - started
            times.append(seconds)
            verdict = "passed"
            if done.returncode != 0:
                failed.append(run)
                log = keep / f"run-{run}.log"
                log.write_text(done.stdout + done.stderr)
                last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
                verdict = f"FAILED ({last}; {log})"
            print(f"run {run}/{args.count}: {verdict} in {seconds:.1f} s", flush=True)
    ordered = sorted(times)
    print(
        f"== {args.count - len(failed)} of {args.count} passed"
        + (f"; failed: runs {', '.join(map(str, failed))} (output in {keep})" if failed else "")
        + f"; time min {ordered[0]:.1f} s, median {ordered[len(ordered) // 2]:.1f} s, "
        f"max {ordered[-1]:.1f} s",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
