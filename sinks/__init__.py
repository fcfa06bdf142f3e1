"""Sink connectors: the targets durable-sinks writes to (Postgres, Kafka, S3, local files).

A sink knows nothing of Spark. Each sink module implements the two-phase protocol described in
docs/protocol.md; the protocol itself, the local-file sink and the conformance suite arrive with
the core issue. This package is the skeleton they grow in: it exports nothing yet.
"""

__all__: list[str] = []
