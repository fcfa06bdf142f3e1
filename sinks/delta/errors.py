"""What a storage or delta-rs failure means for the Delta sink: typed by the table's storage
(storage.py: a refusal no retry changes is a ConfigError with its fix, anything else a
TransientError); a file of this attempt vanishing while it is written means another process
took the attempt away (FencedError)."""

from __future__ import annotations

from typing import Any, Protocol

from durable_sinks.core.errors import DurableSinkError, FencedError
from durable_sinks.core.sink_base import Step

from .storage import TableStorage

#: Actions during which a vanished file means another process took the attempt away.
WRITING_ACTIONS = ("write a data file", "finish the data files")


class Translating(Protocol):
    """What the translation reads of the sink: its storage and the names an error carries."""

    storage: TableStorage

    def where(self, epoch: int | None = None) -> dict[str, Any]: ...


def translate(exc: Exception, step: Step, sink: Translating) -> DurableSinkError | None:
    """The typed error for `exc`, raised by the storage or delta-rs during `step`."""
    where = sink.where(step.epoch)
    if isinstance(exc, FileNotFoundError) and step.action in WRITING_ACTIONS:
        return FencedError(
            f"could not {step.action}: a file of this attempt was deleted by someone else "
            "(a newer coordinator's recovery, or the driver discarding this attempt)",
            **where,
            fix="if another driver of this job started, stop this one; otherwise restart "
            "the query: the epoch is written again",
        )

    def made(cls: type[DurableSinkError], text: str, fix: str | None) -> DurableSinkError:
        return cls(text, **where, fix=fix)

    return sink.storage.failure(exc, step.action, made)
