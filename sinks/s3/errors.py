"""What the S3 client's failures mean for the S3 sink: the clients layer's translation
(`durable_sinks.clients.s3.s3_failure`: retriable, a setting to fix, or in doubt; never a raw
botocore error), naming the sink's job, name and epoch."""

from __future__ import annotations

from typing import Any

from durable_sinks.clients.s3 import s3_failure
from durable_sinks.core.errors import DurableSinkError
from durable_sinks.core.sink_base import SinkBase, Step

from .config import S3


def translate(exc: Exception, step: Step, sink: SinkBase[S3]) -> DurableSinkError | None:
    """The typed error for `exc`, raised by boto3 during `step`; None when it is not the
    client's (it is then raised unchanged)."""
    where: dict[str, Any] = sink.where(step.epoch)
    return s3_failure(exc, step.action, sink.config.connection, **where)
