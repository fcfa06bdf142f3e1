"""The long test tiers and CI's rotation through them (docs/testing.md, "Tiers" and "CI's
rotation").

    python -m tests.long_tiers run TIER [-- PYTEST_ARGS]  a whole tier (make test-faults, ...)
    python -m tests.long_tiers slice K [-- PYTEST_ARGS]   CI's slice K (make test-slice N=K)
    python -m tests.long_tiers ci                         CI's next slice, run and recorded
    python -m tests.long_tiers which                      CI's next slice, printed
    python -m tests.long_tiers plan                       every slice's tests and estimated time
    python -m tests.long_tiers rebalance                  re-deal the slices by measured times

The tiers: `faults` (the fault matrix and the tests marked `fault_tier`), `replicated` (the
tests marked `replicated_tier`), `compat` (the two compatibility lanes) and `crash` (the
conformance scenarios, the SIGKILL and Spark kill tests and the two-queries-one-writer test
with raised counts). CI runs the README's `make test`, then one slice: every test of every long
tier belongs to exactly one of SLICES slices, and CI takes the slice this machine's CI ran
least recently (its record, CI_RECORD, lives in the test bed's cache, which CI keeps), so any
SLICES consecutive CI runs on a machine run every test of every long tier once; with no
record yet (a new machine) it starts at the landing's number (the commits on its first-parent
history) modulo SLICES. The crash tier is run there with its sample counts
(`Tier.sample_env`), the others as a whole tier runs them.

Which slice a test belongs to is recorded in tests/slices.json, dealt by measured time (longest
first, each to the slice with the least so far) by `rebalance`; a test not recorded there
(added since) goes to the slice its name hashes to, so a new test is never left out and the
others never move until the next `rebalance`. Every tier or slice run records each test's time
in `.pytest_cache/ds-times/<tier>.json` (tests/support/timings.py), which `rebalance` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from durable_sinks.testing import EXAMPLES_ENV
from tests.services._layout import REPO_ROOT, Layout
from tests.support.tiers import FAULT_TIER_ENV, REPLICATED_TIER_ENV
from tests.support.timings import TIMES_ENV, read_times

#: How many slices CI rotates through: every test of a long tier runs once in this many
#: consecutive landings.
SLICES = 10
#: Which slice each long-tier test belongs to, and its measured seconds (`rebalance`).
SLICES_FILE = REPO_ROOT / "tests" / "slices.json"
#: Where tier and slice runs record each test's time.
TIMES_DIR = REPO_ROOT / ".pytest_cache" / "ds-times"
#: The crash tier's progress lines (one per 5 % of a conformance scenario's examples).
CRASH_PROGRESS = REPO_ROOT / ".pytest_cache" / "crash-progress.log"
#: Every sink's conformance file: a new sink's is part of the crash tier by its name alone.
CONFORMANCE_TESTS = tuple(
    str(p.relative_to(REPO_ROOT))
    for p in sorted((REPO_ROOT / "tests" / "integration").glob("test_*_conformance.py"))
)


@dataclass(frozen=True)
class Tier:
    """One long tier: the servers it needs, and the pytest runs that make it up (each a
    selection of tests with the environment and options it runs with)."""

    name: str
    servers: tuple[str, ...]
    #: Each run's selection: pytest arguments naming its tests (paths, `-m` expressions).
    selections: tuple[tuple[str, ...], ...]
    #: The environment of the whole tier.
    env: Mapping[str, str] = field(default_factory=dict)
    #: The environment CI's rotation runs it with (bounded counts), when not `env`.
    sample_env: Mapping[str, str] | None = None
    #: pytest options of every run.
    options: tuple[str, ...] = ()
    #: How many of its tests run at once (pytest-xdist workers): a test's share of a slice's
    #: time is its measured time divided by this.
    workers: int = 1

    def environment(self, sample: bool) -> dict[str, str]:
        chosen = self.sample_env if sample and self.sample_env is not None else self.env
        return {**os.environ, **chosen, TIMES_ENV: str(TIMES_DIR / f"{self.name}.json")}


#: The compatibility lanes are run by tests/compat_lanes.py, one lane at a time; their units
#: in a slice are the lanes (`compat::oldest`), timed as a whole.
COMPAT = "compat"
COMPAT_LANES = ("oldest", "newest")

TIERS: dict[str, Tier] = {
    tier.name: tier
    for tier in (
        Tier(
            "faults",
            ("postgres", "kafka", "spark", "faults"),
            (("tests/faults",), ("-m", "fault_tier", "tests")),
            env={FAULT_TIER_ENV: "1"},
            options=("--timeout=3600",),
        ),
        Tier(
            "replicated",
            ("postgres", "kafka", "spark"),
            (("-m", "replicated_tier", "tests"),),
            env={REPLICATED_TIER_ENV: "1"},
            options=("--timeout=3600",),
        ),
        Tier(
            "crash",
            ("postgres", "kafka", "s3", "moto", "spark"),
            (
                (
                    "tests/crash",
                    "tests/simulation",
                    *CONFORMANCE_TESTS,
                    "tests/integration/test_s3_decision_store.py",
                    "tests/integration/test_running_expiry.py",
                    "tests/spark/test_crash.py",
                    "tests/spark/test_shared_writer.py",
                    "tests/upgrade",
                ),
            ),
            env={
                EXAMPLES_ENV: "2000",
                "DS_SIGKILL_RUNS": "50",
                "DS_SPARK_KILLS": "50",
                "DS_SHARED_WRITER_RUNS": "50",
            },
            sample_env={
                EXAMPLES_ENV: "60",
                "DS_SIGKILL_RUNS": "10",
                "DS_SPARK_KILLS": "3",
                "DS_SHARED_WRITER_RUNS": "10",
            },
            options=("-n", "2", "--dist", "loadgroup", "--timeout=7200"),
            workers=2,
        ),
    )
}
TIER_NAMES = (*TIERS, COMPAT)


@dataclass(frozen=True)
class Unit:
    """One test of a long tier (`tier` and its node id), or one compatibility lane."""

    tier: str
    test: str

    @property
    def key(self) -> str:
        return f"{self.tier}::{self.test}"


# -- what each tier holds ------------------------------------------------------------------------
def collect(tier: Tier, sample: bool) -> list[Unit]:
    """The tier's tests, as pytest collects them with the tier's environment (no server is
    started to collect)."""
    units: list[Unit] = []
    for selection in tier.selections:
        listed = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
                *selection,
            ],
            cwd=REPO_ROOT,
            env=tier.environment(sample),
            capture_output=True,
            text=True,
            check=False,
        )
        found = [line for line in listed.stdout.splitlines() if "::" in line]
        if listed.returncode != 0 or not found:
            raise SystemExit(
                f"collecting the {tier.name} tier ({' '.join(selection)}) failed "
                f"(exit {listed.returncode}):\n{listed.stdout[-3000:]}{listed.stderr[-3000:]}"
            )
        units += [Unit(tier.name, test) for test in found if Unit(tier.name, test) not in units]
    return units


def every_unit() -> list[Unit]:
    """Every unit of CI's rotation: each tier's tests (the crash tier's with its sample counts)
    and the compatibility lanes."""
    units = [unit for tier in TIERS.values() for unit in collect(tier, sample=True)]
    return units + [Unit(COMPAT, lane) for lane in COMPAT_LANES]


# -- the slices ----------------------------------------------------------------------------------
@dataclass
class Slices:
    """tests/slices.json: each unit's slice and its share of the slice's time (seconds)."""

    assigned: dict[str, tuple[int, float]]

    @classmethod
    def load(cls) -> Slices:
        if not SLICES_FILE.exists():
            return cls({})
        data = json.loads(SLICES_FILE.read_text())
        return cls({k: (int(v[0]), float(v[1])) for k, v in data["units"].items()})

    def slice_of(self, unit: Unit) -> int:
        found = self.assigned.get(unit.key)
        if found is not None:
            return found[0]
        return zlib.crc32(unit.key.encode()) % SLICES

    def seconds_of(self, unit: Unit) -> float | None:
        found = self.assigned.get(unit.key)
        return found[1] if found is not None else None

    def deal(self, units: Sequence[Unit]) -> dict[int, list[Unit]]:
        dealt: dict[int, list[Unit]] = {k: [] for k in range(SLICES)}
        for unit in units:
            dealt[self.slice_of(unit)].append(unit)
        return dealt


def rebalance(units: Sequence[Unit], times: Mapping[str, float]) -> dict[str, tuple[int, float]]:
    """Deal `units` to SLICES slices by their share of a slice's time (longest first, each
    to the slice with the least so far): a test's measured time over its tier's workers; a
    unit never measured counts as its tier's median."""
    by_tier: dict[str, list[float]] = {}
    for unit in units:
        if unit.key in times:
            by_tier.setdefault(unit.tier, []).append(times[unit.key])

    def estimate(unit: Unit) -> float:
        workers = TIERS[unit.tier].workers if unit.tier in TIERS else 1
        if unit.key in times:
            return times[unit.key] / workers
        known = sorted(by_tier.get(unit.tier, [60.0]))
        return known[len(known) // 2] / workers

    loads = [0.0] * SLICES
    assigned: dict[str, tuple[int, float]] = {}
    for unit in sorted(units, key=lambda u: (-estimate(u), u.key)):
        target = min(range(SLICES), key=lambda k: (loads[k], k))
        loads[target] += estimate(unit)
        assigned[unit.key] = (target, round(estimate(unit), 1))
    return assigned


def measured_times() -> dict[str, float]:
    """Every time the tier and slice runs recorded here, keyed as units are."""
    times: dict[str, float] = {}
    for tier in TIER_NAMES:
        for test, seconds in read_times(TIMES_DIR / f"{tier}.json").items():
            times[f"{tier}::{test}"] = seconds
    return times


#: CI's record of the slices it ran on this machine, oldest first (in the test bed's cache).
CI_RECORD = "ci-slices.json"
#: How many runs the record keeps.
CI_RECORD_RUNS = 40


def ci_record() -> Path:
    return Layout.from_env().cache / CI_RECORD


def ci_runs() -> list[dict[str, object]]:
    """The slices CI ran on this machine, oldest first ([] before the first)."""
    path = ci_record()
    if not path.exists():
        return []
    runs = json.loads(path.read_text()).get("runs", [])
    return [run for run in runs if isinstance(run, dict) and run.get("slice") in range(SLICES)]


def next_slice(runs: Sequence[Mapping[str, object]], landing: int) -> int:
    """The slice CI takes: one it never ran, or else the one it ran least recently; among
    those never run, the first from `landing % SLICES` on."""
    last = {run["slice"]: i for i, run in enumerate(runs)}
    start = landing % SLICES
    return min(range(SLICES), key=lambda k: (last.get(k, -1), (k - start) % SLICES))


def record_ci_run(k: int, passed: bool) -> None:
    runs = [*ci_runs(), {"slice": k, "commit": head(), "passed": passed, "at": time.time()}]
    path = ci_record()
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps({"runs": runs[-CI_RECORD_RUNS:]}, indent=1) + "\n")
    scratch.replace(path)


def head() -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def landings() -> int:
    """The number of commits on HEAD's first-parent history: consecutive landings on the main
    line get consecutive numbers."""
    counted = subprocess.run(
        ["git", "rev-list", "--count", "--first-parent", "HEAD"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(counted.stdout.strip())


# -- running -------------------------------------------------------------------------------------
def up(servers: Sequence[str]) -> None:
    subprocess.run([sys.executable, "-m", "tests.services", "up", *servers], check=True)


@contextmanager
def crash_progress(tier: Tier, env: dict[str, str]) -> Iterator[None]:
    """For the crash tier: its conformance scenarios' progress lines, shown as they come
    (pytest-xdist's workers have no terminal of their own)."""
    if tier.name != "crash":
        yield
        return
    CRASH_PROGRESS.parent.mkdir(parents=True, exist_ok=True)
    CRASH_PROGRESS.write_text("")
    env["DS_CONFORMANCE_PROGRESS"] = str(CRASH_PROGRESS)
    stop = threading.Event()

    def follow() -> None:
        with CRASH_PROGRESS.open() as lines:
            while not stop.is_set():
                line = lines.readline()
                if line:
                    print(line, end="", flush=True)
                else:
                    time.sleep(1)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        yield
    finally:
        stop.set()
        follower.join(timeout=5)


def run_pytest(tier: Tier, args: Sequence[str], sample: bool, extra: Sequence[str]) -> bool:
    env = tier.environment(sample)
    command = [sys.executable, "-m", "pytest", *tier.options, "-v", "--durations=0", *args]
    shown = " ".join(f"{k}={env[k]}" for k in sorted({**tier.env, **(tier.sample_env or {})}))
    print(f"== {tier.name}: {shown} pytest {' '.join(command[3:])[:400]}", flush=True)
    with crash_progress(tier, env):
        done = subprocess.run([*command, *extra], cwd=REPO_ROOT, env=env, check=False)
    return done.returncode == 0


def run_lanes(lanes: Sequence[str], extra: Sequence[str]) -> bool:
    """The compatibility lanes (tests/compat_lanes.py), each timed into the compat times."""
    passed = True
    times = read_times(TIMES_DIR / f"{COMPAT}.json")
    for lane in lanes:
        started = time.monotonic()
        args = [sys.executable, "-m", "tests.compat_lanes", "--lane", lane]
        done = subprocess.run([*args, "--", *extra] if extra else args, cwd=REPO_ROOT, check=False)
        times[lane] = round(time.monotonic() - started, 1)
        passed = passed and done.returncode == 0
    TIMES_DIR.mkdir(parents=True, exist_ok=True)
    (TIMES_DIR / f"{COMPAT}.json").write_text(json.dumps(times, indent=1) + "\n")
    return passed


def run_tier(name: str, extra: Sequence[str], *, sample: bool = False) -> bool:
    """The whole tier, with its full counts (or CI's sample counts)."""
    if name == COMPAT:
        return run_lanes(COMPAT_LANES, extra)
    tier = TIERS[name]
    up(tier.servers)
    results = [run_pytest(tier, selection, sample, extra) for selection in tier.selections]
    return all(results)


def describe(slices: Slices, dealt: Mapping[int, Sequence[Unit]], k: int) -> str:
    units = dealt[k]
    known = [slices.seconds_of(u) for u in units]
    seconds = sum(s for s in known if s is not None)
    unknown = sum(1 for s in known if s is None)
    per_tier = ", ".join(
        f"{tier} {sum(1 for u in units if u.tier == tier)}"
        for tier in TIER_NAMES
        if any(u.tier == tier for u in units)
    )
    more = f", {unknown} not yet measured" if unknown else ""
    return f"slice {k} of {SLICES}: {len(units)} tests ({per_tier}), ~{seconds / 60:.0f} min{more}"


def run_slice(k: int, extra: Sequence[str]) -> bool:
    slices = Slices.load()
    dealt = slices.deal(every_unit())
    print(f"== {describe(slices, dealt, k)}; by hand: make test-slice N={k}", flush=True)
    started = time.monotonic()
    results = []
    for name, tier in TIERS.items():
        tests = [u.test for u in dealt[k] if u.tier == name]
        if tests:
            up(tier.servers)
            results.append(run_pytest(tier, tests, True, extra))
    lanes = [u.test for u in dealt[k] if u.tier == COMPAT]
    if lanes:
        results.append(run_lanes(lanes, extra))
    verdict = "passed" if all(results) else "FAILED"
    print(f"== slice {k}: {verdict} in {(time.monotonic() - started) / 60:.1f} min", flush=True)
    return all(results)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.long_tiers", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="a whole tier")
    run.add_argument("tier", choices=TIER_NAMES)
    run.add_argument("--sample", action="store_true", help="with CI's sample counts")
    run.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    one = commands.add_parser("slice", help="one slice of CI's rotation")
    one.add_argument("k", type=int, choices=range(SLICES))
    one.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    commands.add_parser("ci", help="CI's next slice, run and recorded")
    commands.add_parser("which", help="CI's next slice, printed")
    commands.add_parser("plan", help="print every slice")
    commands.add_parser("rebalance", help="deal the slices again by the measured times")
    args = parser.parse_args(argv)

    if args.command == "run":
        return 0 if run_tier(args.tier, args.pytest_args, sample=args.sample) else 1
    if args.command == "slice":
        return 0 if run_slice(args.k, args.pytest_args) else 1
    if args.command in ("ci", "which"):
        runs = ci_runs()
        k = next_slice(runs, landings())
        if args.command == "which":
            print(k)
            return 0
        ran = ", ".join(str(run["slice"]) for run in runs[-SLICES:]) or "none yet"
        print(f"== CI's slice {k} (this machine's CI ran slices {ran} last)", flush=True)
        passed = run_slice(k, ())
        record_ci_run(k, passed)
        return 0 if passed else 1
    units = every_unit()
    if args.command == "rebalance":
        assigned = rebalance(units, measured_times())
        SLICES_FILE.write_text(
            json.dumps({"slices": SLICES, "units": dict(sorted(assigned.items()))}, indent=1) + "\n"
        )
        print(f"wrote {SLICES_FILE.relative_to(REPO_ROOT)}")
    slices = Slices.load()
    dealt = slices.deal(units)
    for k in range(SLICES):
        print(describe(slices, dealt, k))
        for unit in dealt[k]:
            seconds = slices.seconds_of(unit)
            print(f"    {unit.key}  {'?' if seconds is None else f'{seconds:.0f} s'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
