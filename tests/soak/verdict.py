"""The soak's audit: what every sink holds as its readers see it, what is left in doubt, and
how often each fault kind was injected and how long it held the job up, as one table.

Readers: Postgres committed rows (directly, not through a proxy; on the replicated servers,
whichever is the primary); Kafka read_committed up to the last stable offset; S3 the committed
epochs' objects; the files sink its published epoch folders. Left in doubt: the job's prepared
Postgres transactions, its open Kafka transactions (the brokers' transaction coordinators, by
transactional id), incomplete multipart uploads under the run's prefix, staged files. Pauses:
tests/soak/pauses.py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_sinks.core.naming import job_prefix
from durable_sinks.sinks.folder import STAGING
from tests.services import S3Endpoint
from tests.soak.beds import Bed
from tests.soak.faults import Injected
from tests.soak.pauses import Batch, describe, pause_after, while_starting
from tests.spark.streams import (
    kafka_ids,
    kafka_open_transactions,
    postgres_ids,
    prepared_transactions,
    published_file_ids,
    s3_committed_ids,
)
from tests.support.s3_objects import incomplete_uploads


@dataclass
class Tally:
    """Faults injected per kind (what each did, when it struck), and the moments a kind found
    nothing to act on."""

    kinds: list[str]
    counts: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    events: dict[str, list[Injected]] = field(default_factory=dict)

    def injected(self, kind: str, done: Injected) -> None:
        self.counts[kind] += 1
        self.events.setdefault(kind, []).append(done)

    def missed(self, kind: str) -> None:
        self.skipped[kind] += 1

    def row(
        self, kind: str, batches: list[Batch], starts: list[float], min_per_kind: int
    ) -> tuple[str, str, bool]:
        """The kind's row: how often, the pauses it caused (tests/soak/pauses.py), and whether
        it was often enough."""
        count = self.counts[kind]
        notes = [f"{count} times"]
        events = self.events.get(kind, [])
        running = [e for e in events if not while_starting(e.at, batches, starts)]
        pauses = describe(
            [pause_after(e.at, batches) for e in running], starting=len(events) - len(running)
        )
        if pauses:
            notes.append(pauses)
        if self.skipped[kind]:
            notes.append(f"{self.skipped[kind]} moments with nothing to act on")
        return (f"fault: {kind}", "; ".join(notes), count >= min_per_kind)


@dataclass
class Verdict:
    rows: list[tuple[str, str, bool]]  # (what, value, ok)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(ok for _, _, ok in self.rows)

    def markdown(self) -> str:
        lines = ["| check | result | |", "|---|---|---|"]
        lines += [
            f"| {what} | {value} | {'ok' if ok else 'FAIL'} |" for what, value, ok in self.rows
        ]
        lines += [f"| {key} | {value} | |" for key, value in self.extra.items()]
        return "\n".join(lines) + "\n"


def counted(name: str, ids: list[int], expected: int) -> list[tuple[str, str, bool]]:
    """Rows, duplicates and losses of one sink against ids 0 .. expected-1."""
    unique = set(ids)
    duplicates = len(ids) - len(unique)
    lost = len(set(range(expected)) - unique)
    extra = len(unique - set(range(expected)))
    value = f"{len(ids)} rows; {duplicates} duplicates, {lost} lost, {extra} unexpected"
    return [(f"{name}: every row once", value, duplicates == lost == extra == 0)]


class Audit:
    def __init__(self, bed: Bed, s3: S3Endpoint, plan: dict[str, Any], folder: Path) -> None:
        self.bed, self.s3, self.plan, self.folder = bed, s3, plan, folder

    def postgres_rows(self) -> int | str:
        """Rows committed in Postgres so far (for the log; the server may be down)."""
        try:
            return len(postgres_ids(self.bed.postgres_dsn, self.plan["table"]))
        except Exception as exc:  # noqa: BLE001 - a progress line, not a check
            return f"? ({type(exc).__name__})"

    def verdict(
        self,
        *,
        expected: int,
        tally: Tally,
        min_per_kind: int,
        batches: list[Batch],
        starts: list[float],
    ) -> Verdict:
        """The table; `batches` and `starts` (the drivers' start times) time the pauses."""
        plan, bed = self.plan, self.bed
        rows = [tally.row(kind, batches, starts, min_per_kind) for kind in tally.kinds]
        rows.append(("rows fed", str(expected), expected > 0))
        rows += counted("Postgres", postgres_ids(bed.postgres_dsn, plan["table"]), expected)
        rows += counted("S3", s3_committed_ids(self.s3, plan["s3"]["path"]), expected)
        if plan["mode"] == "driver":
            rows += counted("Kafka (read_committed)", kafka_ids(bed.kafka, plan["topic"]), expected)
            mine = job_prefix(plan["job_id"])
            open_ids = [
                t.transactional_id
                for t in bed.open_kafka_transactions()
                if t.transactional_id.startswith(mine)
            ]
            stuck = kafka_open_transactions(bed.kafka, plan["topic"])
            rows.append(
                (
                    "open Kafka transactions",
                    f"{len(open_ids)} (LSO held back: {len(stuck)})",
                    not open_ids and not stuck,
                )
            )
        else:
            files = Path(plan["files"])
            rows += counted("files", published_file_ids(files), expected)
            staged = sorted((files / STAGING).iterdir()) if (files / STAGING).exists() else []
            rows.append(("staged files left", str(len(staged)), not staged))
        prepared = prepared_transactions(bed.postgres_dsn, plan["job_id"])
        rows.append(("prepared Postgres transactions left", str(len(prepared)), not prepared))
        prefix = plan["s3"]["path"].split("/", 3)[3]
        uploads = incomplete_uploads(self.s3.client(), self.s3.bucket, prefix)
        rows.append(("incomplete S3 uploads left", str(len(uploads)), not uploads))
        return Verdict(rows)
