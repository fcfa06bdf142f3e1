"""A files sink that refuses rows as a target with a check constraint would: every row whose
column `v` is negative (a stand-in for what a server refuses, for tests of the coordinator's
dead-letter routing without a server)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from durable_sinks.core import WriteResult
from durable_sinks.core.bad_rows import Refusal, RefusalReason, RefusedRows
from durable_sinks.sinks.files import FileSink

NEGATIVE = Refusal(
    RefusalReason.CHECK, 'new row violates check constraint "v_not_negative"', "v", "v_not_negative"
)


class RefusingFileSink(FileSink):
    """Refuses rows with v < 0 (reason `check`), by the job's bad-row policy."""

    def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        current = self._require_current()
        refused = RefusedRows.where(pc.less(batch.column("v"), 0), NEGATIVE)
        kept = self._refuse(batch, refused, current.epoch)
        written = super().write_batch(kept)
        return WriteResult(written.rows, written.bytes, refused)
