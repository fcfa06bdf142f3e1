"""Sink connectors: the targets durable-sinks writes to (Postgres, Kafka, S3, local files).

A sink knows nothing of Spark. This is the canonical import path for the protocol:
`from sinks import SinkConnector, CommitHandle, SinkCapabilities, ...`; errors live in
`sinks.errors`, participant names in `sinks.naming`, the conformance suite in `sinks.testing`.
"""

from ._api import (
    CommitHandle,
    CommitOutcome,
    DeliveryGuarantee,
    DistributedSink,
    LastResource,
    OpenContext,
    SinkCapabilities,
    SinkConnector,
    WriteResult,
)
from ._registry import create, kinds, register
from .files import FileSink, FileSinkConfig

__all__ = [
    "CommitHandle",
    "CommitOutcome",
    "DeliveryGuarantee",
    "DistributedSink",
    "FileSink",
    "FileSinkConfig",
    "LastResource",
    "OpenContext",
    "SinkCapabilities",
    "SinkConnector",
    "WriteResult",
    "create",
    "kinds",
    "register",
]
