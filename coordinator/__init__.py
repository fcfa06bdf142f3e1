"""The checkpoint coordinator: drives every sink of a job through one epoch (begin, write,
pre-commit, decision, commit or rollback) and recovers what a crashed coordinator left behind.

It knows the sink protocol (`durable_sinks.core`) and the decision stores
(`durable_sinks.manifest`), never a particular sink, and nothing of Spark. Canonical import
path: `from durable_sinks.coordinator import Coordinator, ...`.
"""

from ._coordinator import Coordinator, EpochOutcome, EpochResult
from ._metrics import EpochMetrics, JobTotals
from ._outage import OutagePolicy
from ._recovery import RecoveryReport, Resolution, resolve
from ._replay import REPLAY_CHECKS, ReplayCheckMode
from ._retry import RetryPolicy
from ._watch import SLOW_PHASE_LOG_S, Call, InFlight, Watch
from ._worker import prepare_part
from .validation import validate

__all__ = [
    "REPLAY_CHECKS",
    "SLOW_PHASE_LOG_S",
    "Call",
    "Coordinator",
    "EpochMetrics",
    "EpochOutcome",
    "EpochResult",
    "InFlight",
    "JobTotals",
    "OutagePolicy",
    "RecoveryReport",
    "ReplayCheckMode",
    "Resolution",
    "RetryPolicy",
    "Watch",
    "prepare_part",
    "resolve",
    "validate",
]
