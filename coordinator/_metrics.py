"""Per-phase timings and counts of epochs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from durable_sinks.core.bad_rows import RefusalCounts

from ._watch import Watch

PHASES = ("lookup", "begin", "write", "pre_commit", "decision", "commit", "finish")


@dataclass
class EpochMetrics:
    """What one epoch cost: seconds per phase, rows and bytes per sink, batches."""

    epoch: int
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    rows: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    #: Seconds each sink spent in write_batch (sinks write concurrently, so these may add up
    #: to more than the "write" phase, which is the time the coordinator waited for them).
    sink_seconds: dict[str, float] = field(default_factory=dict)
    batches: int = 0
    #: Rows each sink refused, by reason, that went to the dead-letter sink.
    dead_letters: RefusalCounts = field(default_factory=RefusalCounts)
    #: Told each phase as it is entered (the epoch in flight), if any.
    watch: Watch | None = field(default=None, repr=False, compare=False)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.watch is not None:
            self.watch.enter(name)
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    @property
    def protocol_seconds(self) -> float:
        """pre_commit + decision + commit: the cost of exactly-once on top of writing."""
        return self.seconds["pre_commit"] + self.seconds["decision"] + self.seconds["commit"]

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())


@dataclass
class JobTotals:
    """Counters since the coordinator started."""

    epochs_committed: int = 0
    epochs_skipped: int = 0
    epochs_failed: int = 0
    rows: int = 0
    bytes: int = 0
    recovered_commits: int = 0
    recovered_rollbacks: int = 0
    #: Replays of decided epochs whose rows differed from the committed ones (the replay
    #: check, coordinator/_replay.py): a non-deterministic query.
    replay_mismatches: int = 0
    #: Rows sinks refused that committed into the dead-letter sink, per sink and reason.
    dead_letters: RefusalCounts = field(default_factory=RefusalCounts)
