"""Sinks that refuse rows as a target with constraints would, for tests of dead-letter routing
without a server:

- RefusingFileSink: every row whose column `v` is negative (a check constraint);
- RefusingConformanceFileSink / RefusingConformanceJsonlSink: rows of the conformance suite's
  schema (durable_sinks.testing.SCHEMA) whose `n` is negative (a check constraint) or whose
  `text` is longer than 8 characters (varchar(8)); CONFORMANCE_BAD_ROWS says so to the
  conformance suite."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st

from durable_sinks.core import WriteResult
from durable_sinks.core.bad_rows import Refusal, RefusalReason, RefusedRows
from durable_sinks.sinks.folder import FolderSink
from durable_sinks.testing import BadRows, Row

NEGATIVE = Refusal(
    RefusalReason.CHECK, 'new row violates check constraint "v_not_negative"', "v", "v_not_negative"
)


class RefusingFileSink(FolderSink):
    """Refuses rows with v < 0 (reason `check`), by the job's bad-row policy."""

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        current = self._require_current()
        refused = RefusedRows.where(pc.less(batch.column("v"), 0), NEGATIVE)
        kept = self._refuse(batch, refused, current.epoch)
        written = super().write_batch(kept)
        return WriteResult(written.rows, written.bytes, refused)


# -- the conformance suite's rows -------------------------------------------------------------
MAX_TEXT = 8
NEGATIVE_N = Refusal(
    RefusalReason.CHECK, 'new row violates check constraint "n_not_negative"', "n", "n_not_negative"
)
TEXT_TOO_LONG = Refusal(
    RefusalReason.TOO_LONG, f"value too long for type character varying({MAX_TEXT})", "text"
)


def conformance_refusals(batch: pa.RecordBatch) -> RefusedRows:
    """The rows of `batch` refused: a negative `n` first, then a `text` over MAX_TEXT."""
    negative = RefusedRows.where(pc.less(batch.column("n"), 0), NEGATIVE_N)
    too_long = pc.greater(pc.utf8_length(batch.column("text")), MAX_TEXT)
    return negative.merged(RefusedRows.where(too_long, TEXT_TOO_LONG))


def conformance_refusal(row: Row) -> RefusalReason | None:
    """What conformance_refusals says of one row (key, n, text, x, flag)."""
    _, n, text, _, _ = row
    if n is not None and n < 0:
        return RefusalReason.CHECK
    if text is not None and len(text) > MAX_TEXT:
        return RefusalReason.TOO_LONG
    return None


_chars = st.characters(codec="utf-8", exclude_characters="\x00")
_floats = st.one_of(st.none(), st.floats(allow_nan=False))
_flags = st.one_of(st.none(), st.booleans())
CONFORMANCE_BAD_ROWS = BadRows(
    refusal=conformance_refusal,
    examples=((-1, "neg", 0.5, True), (3, "ünïcode text, too long", None, None)),
    values=st.one_of(
        st.tuples(
            st.integers(-(2**63), -1),
            st.one_of(st.none(), st.text(alphabet=_chars, max_size=4)),
            _floats,
            _flags,
        ),
        st.tuples(
            st.one_of(st.none(), st.integers(0, 2**63 - 1)),
            st.text(alphabet=_chars, min_size=MAX_TEXT + 1, max_size=20),
            _floats,
            _flags,
        ),
    ),
)


def _refusing_write(sink: Any, batch: pa.RecordBatch, write: Any) -> WriteResult:
    refused = conformance_refusals(batch)
    kept = sink._refuse(batch, refused, sink._require_current().epoch)
    written: WriteResult = write(kept)
    return WriteResult(written.rows, written.bytes, refused)


class RefusingConformanceFileSink(FolderSink):
    """A files sink refusing what CONFORMANCE_BAD_ROWS says, by the job's bad-row policy."""

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        return _refusing_write(self, batch, super().write_batch)


class RefusingConformanceJsonlSink(FolderSink):
    """The JSON Lines sink refusing what CONFORMANCE_BAD_ROWS says, by the job's policy."""

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        return _refusing_write(self, batch, super().write_batch)
