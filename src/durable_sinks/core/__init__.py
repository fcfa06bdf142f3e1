"""The foundation every other layer builds on: the sink protocol, errors, participant
naming, logging with the job, sink and epoch, file durability helpers and secret redaction.

It imports no other part of durable-sinks and no database or Spark client. The sink
protocol's canonical import path is this package: `from durable_sinks.core import
SinkConnector, CommitHandle, SinkKind, ...`; errors are in `durable_sinks.core.errors` (also
re-exported by `durable_sinks`), participant names in `durable_sinks.core.naming`.
"""

from .kinds import SinkKind
from .protocol import (
    JSON,
    ChecksParticipants,
    CommitHandle,
    CommitOutcome,
    ConcurrentCommitter,
    DecisionHost,
    DecisionHostingSink,
    DeliveryGuarantee,
    DistributedSink,
    KeepsCommitRecord,
    LastResource,
    OpenContext,
    PublishingSink,
    RereadsCommitted,
    SharesTransactions,
    SinkCapabilities,
    SinkConnector,
    TaskBriefing,
    WriteResult,
)

__all__ = [
    "JSON",
    "ChecksParticipants",
    "CommitHandle",
    "CommitOutcome",
    "ConcurrentCommitter",
    "DecisionHost",
    "DecisionHostingSink",
    "DeliveryGuarantee",
    "DistributedSink",
    "KeepsCommitRecord",
    "LastResource",
    "OpenContext",
    "PublishingSink",
    "RereadsCommitted",
    "SharesTransactions",
    "SinkCapabilities",
    "SinkConnector",
    "SinkKind",
    "TaskBriefing",
    "WriteResult",
]
