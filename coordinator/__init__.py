"""The checkpoint coordinator: drives every sink of a job through one epoch (begin, write,
pre-commit, decision, commit or rollback) and recovers what a crashed coordinator left behind.

It knows nothing of any particular sink. Canonical import path:
`from coordinator import Coordinator, validate, ...`.
"""

from ._coordinator import Coordinator, EpochOutcome, EpochResult, RetryPolicy
from ._log import LOGGER_NAME, JobLogger
from ._metrics import EpochMetrics, JobTotals
from ._recovery import RecoveryReport, Resolution, resolve
from ._worker import prepare_part
from .validation import validate

__all__ = [
    "LOGGER_NAME",
    "Coordinator",
    "EpochMetrics",
    "EpochOutcome",
    "EpochResult",
    "JobLogger",
    "JobTotals",
    "RecoveryReport",
    "Resolution",
    "RetryPolicy",
    "prepare_part",
    "resolve",
    "validate",
]
