"""Logging with the job, sink and epoch on every line (the logger lives with the protocol)."""

from sinks._log import LOGGER_NAME, JobLogger

__all__ = ["LOGGER_NAME", "JobLogger"]
