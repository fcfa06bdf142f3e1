"""What the file system's failures mean to a folder sink: its one translation path
(`FolderSink._translate` hands every failure here; core/sink_base.py applies it).

- A file of the attempt being written vanishing is the one failure with a meaning of its own:
  only a newer coordinator's recovery removes another generation's staging folder, so the
  writer has been fenced (FencedError). The folder may still be there, half removed, when
  the failure is seen (the recovery deletes its files first): a missing file inside it means
  the same.
- A row the encoder has no form for (JSON Lines: a value of a type JSON cannot hold) is a
  SchemaMismatchError, raised before anything of the batch is written.

Anything else is left to the base: an OSError becomes a TransientError (an InDoubtError where
the step says the outcome is unknown) naming the error and the path.
"""

from __future__ import annotations

from typing import Any

from durable_sinks.core.errors import DurableSinkError, FencedError, SchemaMismatchError
from durable_sinks.core.sink_base import SinkBase, Step

from .encoders import UnencodableError
from .writer import FolderParticipant


def translate(exc: Exception, step: Step, sink: SinkBase[Any]) -> DurableSinkError | None:
    if isinstance(exc, UnencodableError):
        return SchemaMismatchError(
            str(exc),
            **sink.where(step.epoch),
            fix="cast the column to a string or a number before the sink",
        )
    current = getattr(sink, "writing", None)
    if not isinstance(exc, FileNotFoundError) or not isinstance(current, FolderParticipant):
        return None
    inside = str(current.folder) in f"{exc.filename or ''} {exc}"
    if current.folder.exists() and not inside:
        return None
    return FencedError(
        f"staging folder {current.folder.name} was removed by a newer coordinator's recovery",
        **sink.where(step.epoch),
        fix="stop this coordinator; the newer one replays the epoch",
    )
