"""Phase 2 of an epoch in the background: the commits, publishes and finish mark of the
newest decided epoch, run in a thread of their own while the caller goes on to the next
epoch (the coordinator's `background_commits`).

Once an epoch's decision is durable its outcome is fixed: whatever phase 2 has not done when
the driver dies, the next start's recovery does. So phase 2 need not hold up the batch. What
it must not do is overlap another phase 2 or the next decision: recovery finishes only the
newest decided epoch that a sink has not published, which holds because a coordinator
finishes each epoch before it decides the next. Hence the one rule: `settled()` is called
before every decision, and at the start of an epoch that is not newer than the one in the
background (a replay of it); `wait()` when the coordinator closes.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor

from durable_sinks.core.joblog import JobLogger
from durable_sinks.manifest import DecisionRecord

from ._metrics import EpochMetrics
from ._participants import brief

Steps = Generator[str, None, None]
Finish = Callable[[DecisionRecord, EpochMetrics], Steps]


class Phase2:
    """At most one epoch's phase 2 in the background. `enabled` says whether the job's
    epochs use it (set at start)."""

    def __init__(self, job_id: str, log: JobLogger) -> None:
        self.job_id = job_id
        self.log = log
        self.enabled = False
        self._pool: ThreadPoolExecutor | None = None
        #: The epoch begun in the background and not yet settled: its decision, and the
        #: phase 2 running (None once it failed twice: the next `settled()` runs it again).
        self._pending: tuple[DecisionRecord, Future[None] | None] | None = None

    def begin(self, decision: DecisionRecord, run: Callable[[], None]) -> None:
        """Run `run` (the decided epoch's phase 2) in the background. The previous one must
        have been settled (`settled()` runs before every decision)."""
        if self._pending is not None:
            raise RuntimeError("phase 2 of an epoch begun before the previous one settled")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, f"ds-{self.job_id}-phase2")
        self._pending = (decision, self._pool.submit(run))

    def settled(self, metrics: EpochMetrics, finish: Finish, reaching: int | None = None) -> Steps:
        """Wait for the phase 2 in the background (only when its epoch is `reaching` or newer,
        when given); one that failed is run again here by `finish` (idempotent), which raises
        as it would have in the epoch itself, the epoch then still pending (the next call
        runs it again). The wait counts in `metrics`' "commit" phase: what the background
        did not hide."""
        pending = self._pending
        if pending is None or (reaching is not None and pending[0].epoch < reaching):
            return
        decision, future = pending
        if future is not None:
            with metrics.phase("commit"):
                error = future.exception()
            if error is None:
                self._pending = None
                return
            self.log.bind(epoch=decision.epoch).warning(
                "phase 2 in the background failed (%s): finishing the epoch now", brief(error)
            )
        self._pending = (decision, None)
        yield from finish(decision, metrics)
        self._pending = None

    def wait(self) -> None:
        """Wait for the phase 2 in the background and stop the thread; a failure is logged
        (the epoch is decided: the next start's recovery finishes it). Never raises."""
        pending, self._pending = self._pending, None
        if pending is not None:
            decision, future = pending
            error = None if future is None else future.exception()
            if future is None or error is not None:
                self.log.bind(epoch=decision.epoch).warning(
                    "phase 2 in the background failed (%s); the epoch is decided, and the "
                    "next start of the job finishes it",
                    "it failed again in the epoch after" if error is None else brief(error),
                )
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
