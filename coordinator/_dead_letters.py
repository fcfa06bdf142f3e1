"""Dead letters: the rows sinks refused in one epoch (or one executor part), turned into one
record batch for the job's dead-letter sink.

The dead-letter sink is one more participant of the epoch: it is begun, written, prepared and
decided with the targets, so the decision that commits the good rows commits the dead letters
too, and a rollback takes both away. After any crash each row is in exactly one place: its
target or the dead letter. It takes part only in epochs that have dead letters (an epoch
without any costs nothing more), unless it is the job's commit point (a Kafka dead-letter
topic: its transaction carries every epoch's decision).

The cap (`max_bad_rows`, core/bad_rows.BadRowCap) is checked per sink: a count as soon as a
sink passes it, a fraction once the write pass is over. Over it, TooManyBadRowsError is
raised before the decision: nothing of the epoch is committed anywhere.
"""

from __future__ import annotations

import binascii
import datetime
import decimal
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from durable_sinks.core.bad_rows import (
    BadRowCap,
    BadRowsError,
    RefusalCounts,
    RefusedRows,
    TooManyBadRowsError,
    dead_letter_schema,
)
from durable_sinks.core.errors import ConfigError
from durable_sinks.core.protocol import SinkConnector, WriteResult

if TYPE_CHECKING:
    import pyarrow as pa

#: The `part` of dead letters written by the driver's coordinator.
DRIVER_PART = "driver"


@dataclass
class _SinkTally:
    given: int = 0
    refused: list[tuple[int, RefusedRows, pa.RecordBatch]] = field(default_factory=list)

    @property
    def refused_rows(self) -> int:
        return sum(len(r) for _, r, _ in self.refused)


class DeadLetterPass:
    """The dead letters of one write pass: feed it each sink's finished writes (`add`), in
    the order of the batches, then check the cap (`check_cap`) and take the batch for the
    dead-letter sink (`batch`).

    `isolating` is False when the job fails on bad rows: a sink that reports refused rows
    anyway (a sink that does not read `OpenContext.policy`) then fails the epoch here."""

    def __init__(
        self,
        job_id: str,
        epoch: int,
        cap: BadRowCap,
        *,
        isolating: bool,
        part: str = DRIVER_PART,
    ) -> None:
        self.job_id = job_id
        self.epoch = epoch
        self.cap = cap
        self.isolating = isolating
        self.part = part
        self._starts: dict[int, int] = {}
        self._next_start = 0
        self._sinks: dict[str, _SinkTally] = {}

    def read(self, index: int, batch: pa.RecordBatch) -> None:
        """Batch number `index` of the pass was read (its rows start where the previous
        batch's ended)."""
        self._starts[index] = self._next_start
        self._next_start += batch.num_rows

    def add(self, sink: str, index: int, batch: pa.RecordBatch, refused: RefusedRows) -> None:
        """Sink `sink` wrote batch number `index`, refusing `refused`. Raises BadRowsError
        (fail policy) or TooManyBadRowsError (a count cap passed)."""
        tally = self._sinks.setdefault(sink, _SinkTally())
        tally.given += batch.num_rows
        if not refused:
            return
        if not self.isolating:
            raise BadRowsError(
                f"{len(refused)} of {batch.num_rows} rows cannot be written: {refused.summary()}",
                refused=refused,
                job=self.job_id,
                sink=sink,
                epoch=self.epoch,
            )
        tally.refused.append((self._starts.get(index, 0), refused, batch))
        if self.cap.is_count:
            self._check(sink, tally)

    def check_cap(self) -> None:
        """TooManyBadRowsError when a sink refused more rows than the cap allows."""
        for sink, tally in self._sinks.items():
            self._check(sink, tally)

    def _check(self, sink: str, tally: _SinkTally) -> None:
        refused = tally.refused_rows
        if refused <= self.cap.limit(tally.given):
            return
        merged = RefusedRows.of(
            (start + row, refusal)
            for start, rows, _ in tally.refused
            for row, refusal in zip(rows.rows, rows.refusals, strict=True)
        )
        raise TooManyBadRowsError(
            f"the sink refused {refused} of {tally.given} rows so far, more than "
            f"{self.cap.describe(tally.given)} allows (rows numbered in the epoch): "
            f"{merged.summary()}",
            refused=merged,
            job=self.job_id,
            sink=sink,
            epoch=self.epoch,
        )

    @property
    def counts(self) -> RefusalCounts:
        counts = RefusalCounts()
        for sink, tally in self._sinks.items():
            for _, refused, _ in tally.refused:
                counts.add(sink, refused.counts())
        return counts

    def batch(self) -> pa.RecordBatch | None:
        """The dead letters of the pass, one row per refused row (None when there are none),
        in the order of the sinks' first refusals, then of the rows."""
        import pyarrow as pa

        columns: dict[str, list[Any]] = {name: [] for name in dead_letter_schema().names}
        for sink, tally in self._sinks.items():
            for start, refused, batch in tally.refused:
                originals = _rows(batch.take(pa.array(refused.rows, type=pa.int64())))
                for row, refusal, original in zip(
                    refused.rows, refused.refusals, originals, strict=True
                ):
                    columns["job_id"].append(self.job_id)
                    columns["epoch"].append(self.epoch)
                    columns["sink"].append(sink)
                    columns["part"].append(self.part)
                    columns["row_number"].append(start + row)
                    columns["reason"].append(str(refusal.reason))
                    columns["column_name"].append(refusal.column)
                    columns["constraint_name"].append(refusal.constraint)
                    columns["message"].append(_printable(refusal.message))
                    columns["row_json"].append(row_json(original))
        if not columns["job_id"]:
            return None
        return pa.RecordBatch.from_pydict(columns, schema=dead_letter_schema())


def _rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """`batch.to_pylist()`, except that a date or timestamp column Python's datetime cannot
    hold (before year 1 or after 9999: such values are why a target refuses rows) gives
    ISO 8601 strings with expanded years."""
    try:
        rows: list[dict[str, Any]] = batch.to_pylist()
    except (OverflowError, ValueError):
        pass
    else:
        return rows
    import pyarrow as pa

    columns = []
    for array in batch.columns:
        try:
            columns.append(array.to_pylist())
        except (OverflowError, ValueError):
            if not (pa.types.is_timestamp(array.type) or pa.types.is_date(array.type)):
                raise
            raw = array.cast(pa.int32() if pa.types.is_date32(array.type) else pa.int64())
            columns.append([_iso(value, array.type) for value in raw.to_pylist()])
    names = batch.schema.names
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]


def _iso(raw: int | None, kind: Any) -> str | None:
    """A date or timestamp (its integer in Arrow) as ISO 8601 (proleptic Gregorian, a signed
    year past 9999 or before 1), for values Python's datetime cannot hold."""
    import pyarrow as pa

    if raw is None:
        return None
    if pa.types.is_date32(kind):
        return _civil(int(raw))
    if pa.types.is_date64(kind):
        return _civil(int(raw) // 86_400_000)
    per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[kind.unit]
    seconds, fraction = divmod(int(raw), per_second)
    days, second = divmod(seconds, 86_400)
    digits = len(str(per_second)) - 1
    text = f"{_civil(days)}T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
    if digits:
        text += f".{fraction:0{digits}d}"
    return text + ("+00:00" if kind.tz is not None else "")


def _civil(days: int) -> str:
    """Days since 1970-01-01 as an ISO 8601 date (H. Hinnant's days_from_civil inverse)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    shown = f"{year:04d}" if 0 <= year <= 9999 else f"{year:+05d}"
    return f"{shown}-{month:02d}-{day:02d}"


def write_dead_letters(
    sink: SinkConnector, batch: pa.RecordBatch, job_id: str, epoch: int
) -> WriteResult:
    """Write a pass's dead letters into the dead-letter sink (begun for `epoch`); ConfigError
    when it refuses any of them (a dead letter must never become a dead letter itself)."""
    result = sink.write_batch(batch)
    if result.refused:
        raise ConfigError(
            f"the dead-letter sink refused {len(result.refused)} dead letters: "
            f"{result.refused.summary()}",
            job=job_id,
            sink=sink.name,
            epoch=epoch,
            fix="give the dead-letter sink a target that takes every dead letter (e.g. a "
            "table created by the sink: create_table=True; see docs/dead-letters.md)",
        )
    return result


def row_json(row: dict[str, Any]) -> str:
    """A row (from pyarrow's `to_pylist`) as a JSON object any reader parses: binary values
    in base64, decimals as strings, dates, times and timestamps in ISO 8601, durations in
    seconds, non-finite floats as strings ("NaN", "Infinity", "-Infinity"). NUL characters
    stay escaped (\\u0000), so the text fits any target. A binary value's base64 text goes in
    as it is (it never needs escaping): refused rows are often the largest ones (a record
    too large), and escaping is most of what encoding them costs."""
    return "{" + ",".join(f"{_dumps(str(k))}:{_value_json(v)}" for k, v in row.items()) + "}"


def _value_json(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return '"' + binascii.b2a_base64(bytes(value), newline=False).decode("ascii") + '"'
    return _dumps(_plain(value))


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, bytes | bytearray | memoryview):
        return binascii.b2a_base64(bytes(value), newline=False).decode("ascii")
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        # pyarrow gives a map as a list of (key, value) tuples
        return [_plain(v) for v in value]
    return str(value)


def _printable(text: str) -> str:
    """A message without NUL characters (which text columns refuse)."""
    return text.replace("\x00", "\\u0000")
