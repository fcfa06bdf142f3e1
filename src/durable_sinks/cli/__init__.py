"""The `durable-sinks` console command (docs/operations.md): status, inspect,
resolve, verify, doctor and expire for a job, from the same settings as `durable_sink(...)`.
Needs click and rich (dependencies of the package)."""

from ._commands import main

__all__ = ["main"]
