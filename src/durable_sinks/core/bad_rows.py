"""Bad rows and new columns: what a job asks of its sinks' writers, and how a sink says which
rows of a batch it refuses and why.

A *bad row* is a row the target cannot take although the batch's schema fits: a null in a NOT
NULL column, a string longer than varchar(n), a number outside numeric(p,s), a timestamp the
target cannot hold, a Kafka record over the topic's size limit, a foreign-key, unique or check
violation. With `BadRowPolicy.FAIL` (the default) the sink raises BadRowsError (a
SchemaMismatchError) before anything of the epoch is prepared, as it always did. With
`BadRowPolicy.DEAD_LETTER` it leaves the refused rows out of what it writes and returns them
in its WriteResult (`refused`); the coordinator writes them to the job's dead-letter sink *in
the same epoch and the same decision*, so that after any crash each row is in exactly one
place: its target or the dead letter (coordinator/_dead_letters.py).

Refusals name rows by their index in the record batch given to `write_batch`. Their messages
never hold a secret (a sink redacts what its server said before it builds one).

`SchemaEvolution.ADD_COLUMNS` lets a sink that has the capability add a new nullable column
(and widen a column safely: int -> bigint, float -> double) inside the epoch's own
transaction or commit, so the change prepares, commits or rolls back with the data.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import BadRowsError, ConfigError, TooManyBadRowsError
from .text_enum import TextEnum

__all__ = [
    "DEFAULT_MAX_BAD_ROWS",
    "BadRowCap",
    "BadRowPolicy",
    "BadRowsError",
    "Refusal",
    "RefusalCounts",
    "RefusalReason",
    "RefusedRows",
    "SchemaEvolution",
    "TooManyBadRowsError",
    "WritePolicy",
    "dead_letter_schema",
]

if TYPE_CHECKING:
    import pyarrow as pa


class BadRowPolicy(TextEnum):
    """What a sink does with rows it refuses."""

    #: Raise BadRowsError: the epoch fails, nothing of it is committed (the default).
    FAIL = "fail"
    #: Leave them out and report them: the coordinator writes them to the dead-letter sink.
    DEAD_LETTER = "dead_letter"


class SchemaEvolution(TextEnum):
    """What a sink does with a batch column its target does not have."""

    #: Refuse the batch (SchemaMismatchError naming the column and the fix): the default.
    NONE = "none"
    #: Add it as a nullable column, and widen columns safely (int -> bigint, float ->
    #: double), in the epoch's own transaction or commit.
    ADD_COLUMNS = "add_columns"


@dataclass(frozen=True)
class WritePolicy:
    """What the job asks of every sink's writer (`OpenContext.policy`)."""

    on_bad_rows: BadRowPolicy = BadRowPolicy.FAIL
    schema_evolution: SchemaEvolution = SchemaEvolution.NONE

    @property
    def isolates(self) -> bool:
        """Whether refused rows are left out and reported instead of failing the epoch."""
        return self.on_bad_rows is BadRowPolicy.DEAD_LETTER

    @property
    def adds_columns(self) -> bool:
        return self.schema_evolution is SchemaEvolution.ADD_COLUMNS


class RefusalReason(TextEnum):
    """Why a target refused a row (the `reason` column of a dead letter)."""

    NOT_NULL = "not_null"
    #: A string longer than the column's varchar(n) / char(n), or than the target allows.
    TOO_LONG = "too_long"
    #: U+0000 in a text value (Postgres text cannot hold it).
    NUL_CHARACTER = "nul_character"
    #: A number outside the column's range (numeric(p,s), an integer column).
    OUT_OF_RANGE = "out_of_range"
    #: A date or timestamp the target cannot hold.
    TIMESTAMP_OUT_OF_RANGE = "timestamp_out_of_range"
    #: An encoded record larger than the target accepts (Kafka's max.message.bytes).
    RECORD_TOO_LARGE = "record_too_large"
    FOREIGN_KEY = "foreign_key"
    UNIQUE = "unique"
    CHECK = "check"
    EXCLUSION = "exclusion"
    #: Another value the server refused (an invalid encoding, a malformed value).
    INVALID_VALUE = "invalid_value"
    #: Refused by the server for another reason (e.g. a trigger raised).
    REFUSED = "refused"


@dataclass(frozen=True)
class Refusal:
    """Why one or more rows were refused: the reason, the column and the constraint when
    known, and a message (the server's words, secrets redacted)."""

    reason: RefusalReason
    message: str
    column: str | None = None
    constraint: str | None = None

    def describe(self) -> str:
        where = []
        if self.column is not None:
            where.append(f"column {self.column!r}")
        if self.constraint is not None:
            where.append(f"constraint {self.constraint!r}")
        return f"{self.reason}" + (f" ({', '.join(where)})" if where else "")


@dataclass(frozen=True)
class RefusedRows:
    """Rows of one record batch a sink refused: `rows[i]` (an index into the batch given to
    `write_batch`) for `refusals[i]`. Each row appears once (its first refusal)."""

    rows: tuple[int, ...] = ()
    refusals: tuple[Refusal, ...] = ()

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.refusals):
            raise ValueError("RefusedRows needs one refusal per row")

    def __len__(self) -> int:
        return len(self.rows)

    def __bool__(self) -> bool:
        return bool(self.rows)

    @classmethod
    def of(cls, pairs: Iterable[tuple[int, Refusal]]) -> RefusedRows:
        """From (row, refusal) pairs; a row given twice keeps its first refusal; ordered by
        row."""
        first: dict[int, Refusal] = {}
        for row, refusal in pairs:
            first.setdefault(int(row), refusal)
        ordered = sorted(first.items())
        return cls(tuple(r for r, _ in ordered), tuple(f for _, f in ordered))

    @classmethod
    def where(cls, mask: pa.Array | pa.ChunkedArray, refusal: Refusal) -> RefusedRows:
        """The rows where the boolean `mask` is true (nulls count as false), all for
        `refusal`. Vectorized: nothing per row in Python but the resulting indices."""
        import pyarrow.compute as pc

        hits = pc.indices_nonzero(pc.fill_null(mask, False)).to_pylist()
        return cls(tuple(hits), (refusal,) * len(hits))

    def merged(self, *others: RefusedRows) -> RefusedRows:
        """These refusals and `others`', each row keeping the first refusal found for it."""
        pairs = [*zip(self.rows, self.refusals, strict=True)]
        for other in others:
            pairs.extend(zip(other.rows, other.refusals, strict=True))
        return RefusedRows.of(pairs)

    def through(self, kept: Sequence[int]) -> RefusedRows:
        """These refusals, made of row indices of a batch that kept only the rows `kept` of
        an outer batch, as indices of the outer batch."""
        return RefusedRows(tuple(kept[r] for r in self.rows), self.refusals)

    def counts(self) -> Counter[RefusalReason]:
        return Counter(r.reason for r in self.refusals)

    def summary(self, limit: int = 3) -> str:
        """The most frequent refusals, with counts and the first row of each: for errors."""
        first_row: dict[str, int] = {}
        counted: Counter[str] = Counter()
        sample: dict[str, Refusal] = {}
        for row, refusal in zip(self.rows, self.refusals, strict=True):
            key = refusal.describe()
            counted[key] += 1
            first_row.setdefault(key, row)
            sample.setdefault(key, refusal)
        parts = [
            f"{key}: {n} row{'s' if n != 1 else ''} (first: row {first_row[key]}: "
            f"{sample[key].message})"
            for key, n in counted.most_common(limit)
        ]
        more = len(counted) - limit
        return "; ".join(parts) + (f"; and {more} other reasons" if more > 0 else "")

    def kept_mask(self, num_rows: int) -> pa.Array:
        """A boolean mask of the batch's rows that were not refused."""
        import numpy as np
        import pyarrow as pa

        keep = np.ones(num_rows, dtype=bool)
        keep[list(self.rows)] = False
        return pa.array(keep, type=pa.bool_())


#: The default of `max_bad_rows`: at most this fraction of a sink's rows in an epoch (rounded
#: up, so a single bad row is always allowed) go to the dead letter.
DEFAULT_MAX_BAD_ROWS = 0.1


@dataclass(frozen=True)
class BadRowCap:
    """`max_bad_rows`: an int is a count of rows per sink and epoch; a float in (0, 1] is a
    fraction of the sink's rows in the epoch (rounded up). More refused rows than that fail
    the epoch (TooManyBadRowsError). In executor mode each Spark partition is held to it."""

    max_bad_rows: int | float = DEFAULT_MAX_BAD_ROWS

    def __post_init__(self) -> None:
        value = self.max_bad_rows
        ok = (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or (
            isinstance(value, float) and 0.0 < value <= 1.0
        )
        if not ok:
            raise ConfigError(
                f"max_bad_rows must be a count (an int >= 0) or a fraction of the epoch (a "
                f"float in (0, 1]), not {value!r}",
                fix=f"max_bad_rows=1000 (rows per sink and epoch) or max_bad_rows=0.05 (5% of "
                f"them); the default is {DEFAULT_MAX_BAD_ROWS}",
            )

    @property
    def is_count(self) -> bool:
        return isinstance(self.max_bad_rows, int)

    def limit(self, rows: int) -> int:
        """How many of `rows` rows may be refused."""
        if isinstance(self.max_bad_rows, int):
            return self.max_bad_rows
        return math.ceil(self.max_bad_rows * rows)

    def describe(self, rows: int) -> str:
        if isinstance(self.max_bad_rows, int):
            return f"max_bad_rows={self.max_bad_rows}"
        return f"max_bad_rows={self.max_bad_rows:g} ({self.limit(rows)} of {rows} rows)"


@dataclass
class RefusalCounts:
    """Refused rows per sink and reason (what metrics, logs and `inspect` show)."""

    by_sink: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, sink: str, counts: Mapping[RefusalReason, int] | Mapping[str, int]) -> None:
        mine = self.by_sink.setdefault(sink, {})
        for reason, n in counts.items():
            mine[str(reason)] = mine.get(str(reason), 0) + n

    def total(self, sink: str | None = None) -> int:
        sinks = [sink] if sink is not None else list(self.by_sink)
        return sum(sum(self.by_sink.get(s, {}).values()) for s in sinks)

    def __bool__(self) -> bool:
        return self.total() > 0


def dead_letter_schema() -> pa.Schema:
    """The columns of every dead letter, whatever the dead-letter sink (a table created for
    it has these columns; docs/dead-letters.md):

    - job_id, epoch: the job and epoch the row belonged to;
    - sink: the name of the sink that refused it (its target);
    - part: which participant of the epoch the row was read by ("driver" in driver mode,
      the Spark partition's part name in executor mode);
    - row_number: the row's position among the rows that part gave that sink (0-based);
    - reason: a RefusalReason value; column_name, constraint_name: when known;
    - message: why, in the target's words (secrets redacted);
    - row_json: the whole original row as a JSON object (binary values in base64, decimals
      as strings, dates and timestamps in ISO 8601, non-finite floats as strings).

    (job_id, sink, epoch, part, row_number) names a dead letter uniquely."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("job_id", pa.string(), nullable=False),
            pa.field("epoch", pa.int64(), nullable=False),
            pa.field("sink", pa.string(), nullable=False),
            pa.field("part", pa.string(), nullable=False),
            pa.field("row_number", pa.int64(), nullable=False),
            pa.field("reason", pa.string(), nullable=False),
            pa.field("column_name", pa.string()),
            pa.field("constraint_name", pa.string()),
            pa.field("message", pa.string(), nullable=False),
            pa.field("row_json", pa.string(), nullable=False),
        ]
    )
