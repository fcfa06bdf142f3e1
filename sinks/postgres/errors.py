"""psycopg's errors, translated into the protocol's: what the coordinator may retry, what the
data or the table must fix, and what means a newer coordinator took over."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from durable_sinks.clients.postgres import connection_lost, server_of
from durable_sinks.core.bad_rows import BadRowsError, Refusal, RefusalReason, RefusedRows
from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    FencedError,
    InDoubtError,
    SchemaMismatchError,
    TransientError,
)
from durable_sinks.core.protocol import OpenContext
from durable_sinks.core.redaction import MASK
from durable_sinks.core.sink_base import Step

from .config import Postgres

#: Errors Postgres raises for data that does not fit the table: the epoch cannot succeed as
#: it is, whatever the retries. DataError is SQLSTATE class 22 (a value: too long, out of
#: range, not in the character set), IntegrityError class 23 (a constraint: unique, foreign
#: key, check, not null); a key twice in one upsert merge is CardinalityViolation (21000).
DATA_ERRORS = (psycopg.DataError, psycopg.IntegrityError, psycopg.errors.CardinalityViolation)
#: Errors that mean the table, its schema or a privilege is not what the job needs (e.g.
#: dropped or revoked while the job runs): the configuration, not the data, must change.
SETUP_ERRORS = (
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.InsufficientPrivilege,
)

#: The CONTEXT line of an error raised by COPY: "COPY events, line 3, column amount: ...".
_COPY_CONTEXT = re.compile(r"COPY [^,]+, line (\d+)(?:, column ([^:\n]+))?")
#: The key of a unique or foreign key violation's detail: "Key (id)=(7) already exists."
_KEY_DETAIL = re.compile(r"Key \((.+?)\)=\((.*)\) (?:already exists|is not present)")
#: The length limit in "value too long for type character varying(10)".
_LENGTH = re.compile(r"value too long for type (character varying|character)\((\d+)\)")


def first_line(exc: BaseException) -> str:
    """The first line of a driver error (the rest is context and hints), or its type."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def where_in_copy(exc: psycopg.Error) -> tuple[str | None, int | None]:
    """The column and the row (1-based, within the batch the COPY sent) a COPY error names
    in its context, as far as it names them."""
    found = _COPY_CONTEXT.search(exc.diag.context or "")
    if found is None:
        return exc.diag.column_name, None
    return (found.group(2) or exc.diag.column_name), int(found.group(1))


def refusal(exc: psycopg.Error, config: Postgres | None) -> tuple[str, str]:
    """What a data error says about the epoch's data, and its fix, naming the column, row,
    constraint and key as far as the server names them."""
    column, row = where_in_copy(exc)
    place = ", ".join(
        part
        for part in (
            f"column {column!r}" if column else "",
            f"row {row} of a batch" if row is not None else "",
            f"constraint {exc.diag.constraint_name!r}" if exc.diag.constraint_name else "",
        )
        if part
    )
    message = f"Postgres refused the epoch's data: {first_line(exc)}" + (
        f" ({place})" if place else ""
    )
    table = config.table if config is not None else "<table>"
    name = column or "<column>"
    key = _KEY_DETAIL.search(exc.diag.message_detail or "")
    if isinstance(exc, psycopg.errors.UniqueViolation):
        columns = key.group(1) if key else "<key>"
        message += f": key ({columns})=({key.group(2) if key else '...'})"
        if config is not None and exc.diag.table_name == config.table_name:
            if config.mode == "append":
                names = ", ".join(repr(c.strip()) for c in columns.split(","))
                return message, (
                    "the table already holds a row with this key (or the epoch holds it twice): "
                    f"use mode='upsert' with key=({names},) to update such rows, or deduplicate "
                    "the query and filter out keys already written; nothing of the epoch was "
                    "committed"
                )
            return message, (
                f"the upsert key is {list(config.key)} but the rows also collide on this unique "
                "constraint: deduplicate on it too, or drop the constraint; nothing of the epoch "
                "was committed"
            )
        return message, "deduplicate the rows on that key; nothing of the epoch was committed"
    if isinstance(exc, psycopg.errors.ForeignKeyViolation):
        if key:
            message += f": key ({key.group(1)})=({key.group(2)}) is not in the referenced table"
        return message, (
            "write the referenced rows first (in an earlier epoch, or another job's), filter "
            "rows without them, or make the constraint DEFERRABLE or drop it; nothing of the "
            "epoch was committed"
        )
    if isinstance(exc, psycopg.errors.CheckViolation | psycopg.errors.ExclusionViolation):
        return message, (
            "filter or fix the rows that break the constraint in the query, or alter the "
            "constraint; nothing of the epoch was committed"
        )
    if isinstance(exc, psycopg.errors.NotNullViolation):
        return message, (
            f'fill or filter the nulls in the query (e.g. coalesce or where("{name} IS NOT '
            f'NULL")), or make the column nullable; nothing of the epoch was committed'
        )
    if isinstance(exc, psycopg.errors.StringDataRightTruncation):
        limit = _LENGTH.search(first_line(exc))
        n = limit.group(2) if limit else "<n>"
        return message, (
            f'shorten the values in Spark (substring(col("{name}"), 1, {n})) or filter them, '
            f"or widen the column: ALTER TABLE {table} ALTER COLUMN {name} TYPE text; "
            "nothing of the epoch was committed"
        )
    if isinstance(exc, psycopg.errors.NumericValueOutOfRange):
        if exc.diag.message_detail:
            message += f": {exc.diag.message_detail}"
        return message, (
            f"filter or fix the values too large for the column in the query, or widen it: "
            f"ALTER TABLE {table} ALTER COLUMN {name} TYPE numeric(<more digits>,<scale>); "
            "nothing of the epoch was committed"
        )
    if isinstance(exc, psycopg.errors.DatetimeFieldOverflow):
        return message, (
            f"filter or fix the out-of-range values of {name!r} in the query (Postgres "
            "timestamps run from 4713 BC to 294276 AD, dates to 5874897 AD); nothing of the "
            "epoch was committed"
        )
    return message, "fix the data or the table; nothing of the epoch was committed"


@dataclass(frozen=True)
class PostgresStep(Step):
    """What the sink was doing when psycopg raised, for the translated error: the protocol
    call and its statement (`action`), the server (`host:port/db`, never credentials), and,
    for the statements whose outcome a lost session leaves unknown (PREPARE TRANSACTION,
    COMMIT PREPARED, the one-phase COMMIT), what settles it (`in_doubt`)."""

    server: str = ""
    #: The statement runs in the epoch's own (not yet prepared or committed) transaction.
    in_epoch: bool = False


#: What a lost session means for the epoch's own transaction.
_REPLAY_FIX = (
    "nothing of the epoch was committed: replaying it (a new coordinator, or the query's "
    "restart) writes it again once the server answers; if this repeats, look for restarts, "
    "pg_terminate_backend or idle_in_transaction_session_timeout in the server's log, or "
    "a network problem"
)
#: What a lost session means for any other call: it opens a new session when repeated.
_RETRY_FIX = (
    "repeating the call opens a new session once the server answers (the coordinator retries "
    "commits and rollbacks; a new coordinator, or the query's restart, replays the epoch and "
    "recovers what is left); if this repeats, look for restarts or pg_terminate_backend in "
    "the server's log, or a network problem"
)


class Translating(Protocol):
    """What the translation reads of the sink: its settings, its open context, and whether a
    newer generation holds the fence (read on a fresh session)."""

    config: Postgres

    @property
    def context(self) -> OpenContext: ...

    def fence_moved(self) -> bool: ...


def translate(exc: Exception, step: Step, sink: Translating) -> DurableSinkError | None:
    """The typed error for `exc`, raised by psycopg during `step` (a `PostgresStep`, or a
    plain one of the sink base's guards): `psycopg_failure`'s."""
    known = (
        step
        if isinstance(step, PostgresStep)
        else PostgresStep(step.action, step.epoch, step.in_doubt, server_of(sink.config.dsn))
    )
    return psycopg_failure(exc, sink.context, known, sink.fence_moved, sink.config)


def psycopg_failure(
    exc: Exception,
    context: OpenContext,
    step: PostgresStep,
    fence_moved: Callable[[], bool],
    config: Postgres | None = None,
) -> DurableSinkError | None:
    """What a psycopg error raised during `step` means (None for anything not psycopg's):

    - data errors: SchemaMismatchError naming the column, row, constraint or key (`config`
      says which table and mode the sink writes);
    - a missing schema, table, column or privilege: ConfigError;
    - a lost session (connection_lost: the server ended it, restarted or became
      unreachable): FencedError when `fence_moved()` says a newer generation opened the sink
      (it ends older sessions); else InDoubtError when `step.in_doubt` (the statement may or
      may not have taken effect), else TransientError; each names the server and the step;
    - any other OperationalError (a lock or statement time-out, a deadlock, a serialization
      failure, the server out of resources): TransientError;
    - anything else the server refused: DurableSinkError (not retriable), with its SQLSTATE."""
    where: dict[str, Any] = {"job": context.job_id, "sink": context.sink, "epoch": step.epoch}
    if isinstance(exc, DATA_ERRORS):
        message, fix = refusal(exc, config)
        return SchemaMismatchError(message, **where, fix=fix)
    if isinstance(exc, SETUP_ERRORS):
        return config_error(
            context,
            f"Postgres refused the sink's statement: {first_line(exc)}",
            epoch=step.epoch,
            fix="create the schema or table (CREATE SCHEMA ...), or grant the job's user the "
            "privileges docs/postgres.md lists, then restart the job",
        )
    if not isinstance(exc, psycopg.Error):
        return None
    if connection_lost(exc):
        if fence_moved():
            return FencedError(
                "a newer coordinator opened this sink (and ended this session)", **where
            )
        lost = f"lost the session with Postgres at {step.server} during {step.action}"
        if step.in_doubt is not None:
            return InDoubtError(
                f"{lost}, so whether it took effect is unknown: {first_line(exc)}",
                **where,
                fix=step.in_doubt,
            )
        return TransientError(
            f"{lost}: {first_line(exc)}",
            **where,
            fix=_REPLAY_FIX if step.in_epoch else _RETRY_FIX,
        )
    if isinstance(exc, psycopg.OperationalError):
        return TransientError(
            f"Postgres at {step.server} could not complete {step.action} now: "
            f"{first_line(exc)} (SQLSTATE {exc.sqlstate})",
            **where,
            fix="retrying may succeed (a lock or statement time-out, a deadlock or "
            "serialization failure, or the server short of resources)"
            + ("; nothing of the epoch was committed" if step.in_epoch else ""),
        )
    return DurableSinkError(
        f"Postgres at {step.server} refused {step.action}: {first_line(exc)} "
        f"(SQLSTATE {exc.sqlstate})",
        **where,
        fix="see the server's log for the statement; if the server is a read-only standby, "
        "point the DSN at the primary (target_session_attrs=read-write)",
    )


#: Errors of a COPY that some rows of it caused, which the sink isolates in dead-letter mode:
#: a value the column refuses (class 22), a constraint (class 23), a trigger raising
#: (P0001, RAISE EXCEPTION). Anything else (a lost session, a lock time-out, a privilege)
#: fails the epoch as in fail mode.
ROW_ERRORS = (psycopg.DataError, psycopg.IntegrityError, psycopg.errors.RaiseException)
#: SQLSTATEs raised while the row that caused them is inserted, so that COPY's error context
#: names that row; the others (a foreign key, checked at the end of the statement; a trigger)
#: are found by bisection.
_ROW_LEVEL = ("22", "23502", "23505", "23514", "23P01")
_REASONS = {
    "23502": RefusalReason.NOT_NULL,
    "23503": RefusalReason.FOREIGN_KEY,
    "23505": RefusalReason.UNIQUE,
    "23514": RefusalReason.CHECK,
    "23P01": RefusalReason.EXCLUSION,
    "22001": RefusalReason.TOO_LONG,
    "22003": RefusalReason.OUT_OF_RANGE,
    "22008": RefusalReason.TIMESTAMP_OUT_OF_RANGE,
}
#: `name=value` / `name: value` pairs whose name says the value is a secret.
_SECRET_PAIR = re.compile(
    r"\b(\w*(?:password|secret|token|credential|key)\w*)(\s*[=:]\s*)([^\s,;)\]}'\"]+)",
    re.IGNORECASE,
)


def row_named(exc: psycopg.Error, rows: int) -> int | None:
    """The row (0-based, within the COPY of `rows` rows) that caused `exc`, when the error
    is raised while that row is inserted and COPY's context names it; else None."""
    state = exc.sqlstate or ""
    if not state.startswith(_ROW_LEVEL):
        return None
    _, line = where_in_copy(exc)
    return line - 1 if line is not None and 1 <= line <= rows else None


def server_refusal(exc: psycopg.Error, secrets: tuple[str, ...] = ()) -> Refusal:
    """What the server said about a row it refused, as a Refusal: the reason from the
    SQLSTATE, the column and constraint from the error's fields, and its primary message
    with `secrets` (the DSN's passwords) and secret-looking `name=value` pairs masked."""
    state = exc.sqlstate or ""
    reason = _REASONS.get(state)
    message = exc.diag.message_primary or first_line(exc)
    if reason is None:
        if state == "22021" and "0x00" in message:
            reason = RefusalReason.NUL_CHARACTER
        elif state.startswith("22"):
            reason = RefusalReason.INVALID_VALUE
        else:
            reason = RefusalReason.REFUSED
    for secret in secrets:
        if secret:
            message = message.replace(secret, MASK)
    message = _SECRET_PAIR.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", message)
    column, _ = where_in_copy(exc)
    return Refusal(
        reason,
        f"{message} (SQLSTATE {state})",
        column=column,
        constraint=exc.diag.constraint_name,
    )


def bad_rows_fix(refused: RefusedRows, config: Postgres) -> str:
    """How to fix each (reason, column) of `refused`, for a BadRowsError in fail mode, then
    the way out every bad row has: a dead-letter sink."""
    table = config.table
    fixes: dict[str, None] = {}
    for refusal in refused.refusals:
        name = refusal.column or "<column>"
        reason = refusal.reason
        if reason is RefusalReason.NOT_NULL:
            fix = (
                f'fill or filter the nulls of {name!r} (coalesce, or where("{name} IS NOT '
                f'NULL")), or make the column nullable'
            )
        elif reason is RefusalReason.NUL_CHARACTER:
            fix = f'strip U+0000 from {name!r}: regexp_replace(col("{name}"), "\\x00", "")'
        elif reason is RefusalReason.TOO_LONG:
            fix = (
                f'shorten {name!r} (substring(col("{name}"), 1, <n>)) or widen the column: '
                f"ALTER TABLE {table} ALTER COLUMN {name} TYPE text"
            )
        elif reason is RefusalReason.OUT_OF_RANGE:
            fix = (
                f"filter the values of {name!r} too large for the column, or widen it: ALTER "
                f"TABLE {table} ALTER COLUMN {name} TYPE numeric(<more digits>,<scale>)"
            )
        elif reason is RefusalReason.TIMESTAMP_OUT_OF_RANGE:
            fix = f"filter or fix the out-of-range values of {name!r}"
        else:
            fix = "fix the rows or the constraint"
        fixes.setdefault(fix)
    return "; ".join(fixes) + "; or " + BadRowsError.default_fix


def config_error(
    context: OpenContext, message: str, *, fix: str, epoch: int | None = None
) -> ConfigError:
    """A ConfigError about this sink: a setting, a table or a privilege to fix."""
    return ConfigError(message, job=context.job_id, sink=context.sink, epoch=epoch, fix=fix)
