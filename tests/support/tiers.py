"""How much of each repeated test one run does (docs/testing.md, "Tiers").

The default suite (`make test`, CI) runs every test once with counts that still reach every
crash point and every fault: the conformance scenarios run their scripted sweep (one example
per crash point) and a small generated sample, the kill loops a kill or two. The extended
crash run (`make test-crash`) runs the same tests with the counts raised through the
environment variables named here.
"""

from __future__ import annotations

import os

from durable_sinks.testing import EXAMPLES_ENV


def _count(variable: str, default: int) -> int:
    raw = os.environ.get(variable)
    return int(raw) if raw else default


#: Generated conformance examples per scenario after the scripted sweep. The conformance
#: suite itself reads EXAMPLES_ENV (DS_CONFORMANCE_EXAMPLES), which replaces this count.
CONFORMANCE_SAMPLE = 3
#: What the examples count is in this run (for assertions on what a run exercised).
CONFORMANCE_EXAMPLES = _count(EXAMPLES_ENV, CONFORMANCE_SAMPLE)
#: Generated examples of each dead-letter conformance scenario (on_bad_rows="dead_letter")
#: after its sweep, which already crashes at every step kind with dead letters in its epochs;
#: EXAMPLES_ENV replaces it too.
DEAD_LETTER_SAMPLE = 3
DEAD_LETTER_EXAMPLES = _count(EXAMPLES_ENV, DEAD_LETTER_SAMPLE)
#: Random SIGKILLs of a running files job before it is let finish (tests/crash/test_sigkill.py).
SIGKILL_RUNS = _count("DS_SIGKILL_RUNS", 2)
#: SIGKILLs of a real Spark driver per mode (tests/spark/test_crash.py).
SPARK_KILLS = _count("DS_SPARK_KILLS", 1)
#: Runs of two queries started at once on one writer (tests/spark/test_shared_writer.py).
SHARED_WRITER_RUNS = _count("DS_SHARED_WRITER_RUNS", 1)
#: Set to "1" by `make test-faults`: the whole fault matrix (every fault at every step), and the
#: tests marked `fault_tier` (the test bed's own fault handling, which the Spark cluster tests
#: of the default suite also go through), which the default suite deselects.
FAULT_TIER_ENV = "DS_FAULT_MATRIX"
#: Set to "1" to run the compatibility lanes' smoke subset (the test marked `compat_tier`,
#: tests/spark/test_compat_lanes.py) in a pytest run: `make test-fresh` sets it, so a fresh
#: machine builds the lanes and runs them; the default suite deselects it, and `make
#: test-compat` runs the lanes' whole set.
COMPAT_SMOKE_ENV = "DS_COMPAT_SMOKE"
#: Set to "1" by `make test-replicated`: the tests marked `replicated_tier`, on the replicated
#: servers (a three-broker Kafka cluster, a Postgres primary with a streaming standby), which
#: the default suite deselects.
REPLICATED_TIER_ENV = "DS_REPLICATED"
#: The long tiers' marks, each with the variable whose value includes its tests in a run; the
#: default suite deselects them (tests/conftest.py). `TIERS_ENV` includes any of them by name
#: as well: the compatibility lanes run the Spark kill tests the default suite leaves to the
#: crash and fault tiers (tests/compat_lanes.py).
TIER_MARKS = {
    "fault_tier": FAULT_TIER_ENV,
    "crash_tier": EXAMPLES_ENV,
    "compat_tier": COMPAT_SMOKE_ENV,
    "replicated_tier": REPLICATED_TIER_ENV,
}
#: Comma-separated marks of TIER_MARKS whose tests a run includes (e.g. "fault_tier,crash_tier").
TIERS_ENV = "DS_TIERS"


def tier_included(mark: str) -> bool:
    """Whether this run includes the tests marked `mark` (one of TIER_MARKS)."""
    value = os.environ.get(TIER_MARKS[mark], "")
    named = {m.strip() for m in os.environ.get(TIERS_ENV, "").split(",")}
    # The examples count includes the crash tier whatever it is; the others are switches.
    return mark in named or (value != "" if mark == "crash_tier" else value == "1")
