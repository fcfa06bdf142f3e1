"""psycopg's errors, translated into the protocol's: what the coordinator may retry, what the
data or the table must fix, and what means a newer coordinator took over."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import psycopg

from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    FencedError,
    SchemaMismatchError,
    TransientError,
)
from durable_sinks.core.protocol import OpenContext

#: Errors Postgres raises for data that does not fit the table: the epoch cannot succeed as
#: it is, whatever the retries.
DATA_ERRORS = (
    psycopg.errors.NotNullViolation,
    psycopg.errors.CardinalityViolation,
    psycopg.errors.CharacterNotInRepertoire,
    psycopg.errors.UntranslatableCharacter,
    psycopg.errors.StringDataRightTruncation,
    psycopg.errors.NumericValueOutOfRange,
)


def first_line(exc: BaseException) -> str:
    """The first line of a driver error (the rest is context and hints), or its type."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


@contextlib.contextmanager
def translated(
    context: OpenContext, epoch: int | None, fence_moved: Callable[[], bool]
) -> Iterator[None]:
    """Translate psycopg errors raised inside the block: data errors become
    SchemaMismatchError; a lost session becomes FencedError when `fence_moved()` says a newer
    generation opened the sink (it ends older sessions), TransientError otherwise. Our own
    errors pass through."""
    try:
        yield
    except DurableSinkError:
        raise
    except DATA_ERRORS as exc:
        raise SchemaMismatchError(
            f"Postgres refused the epoch's data: {first_line(exc)}",
            job=context.job_id,
            sink=context.sink,
            epoch=epoch,
            fix="fix the data or the table; nothing of the epoch was committed",
        ) from None
    except psycopg.OperationalError as exc:
        if fence_moved():
            raise FencedError(
                "a newer coordinator opened this sink (and ended this session)",
                job=context.job_id,
                sink=context.sink,
                epoch=epoch,
            ) from None
        raise TransientError(
            f"Postgres connection problem: {first_line(exc)}",
            job=context.job_id,
            sink=context.sink,
            epoch=epoch,
        ) from None


def refuse_data(context: OpenContext, epoch: int, problems: list[str]) -> None:
    """Raise SchemaMismatchError naming `problems` (rows or values the table cannot take),
    if there are any."""
    if problems:
        raise SchemaMismatchError(
            "; ".join(problems),
            job=context.job_id,
            sink=context.sink,
            epoch=epoch,
            fix="clean or filter the data; nothing of the epoch was committed",
        )


def config_error(
    context: OpenContext, message: str, *, fix: str, epoch: int | None = None
) -> ConfigError:
    """A ConfigError about this sink: a setting, a table or a privilege to fix."""
    return ConfigError(message, job=context.job_id, sink=context.sink, epoch=epoch, fix=fix)
