"""The soak's audit: what every sink holds as its readers see it, what is left in doubt, and
how often each fault kind was injected, as one table.

Readers: Postgres committed rows (direct, not through the proxy); Kafka read_committed up to
the last stable offset; S3 the committed epochs' objects; the files sink its published epoch
folders. Left in doubt: the job's prepared Postgres transactions, its open Kafka transactions
(the broker's transaction coordinator, by transactional id), incomplete multipart uploads
under the run's prefix, staged files.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_sinks.core.naming import job_prefix
from durable_sinks.sinks.files import STAGING
from tests.services import S3Endpoint
from tests.spark.streams import (
    kafka_ids,
    kafka_open_transactions,
    postgres_ids,
    published_file_ids,
    s3_committed_ids,
)
from tests.support.fault_bed import FaultBed
from tests.support.s3_objects import incomplete_uploads


@dataclass
class Tally:
    """Faults injected per kind, and the moments a kind found nothing to act on."""

    kinds: list[str]
    counts: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    events: list[str] = field(default_factory=list)

    def injected(self, kind: str, what: str) -> None:
        self.counts[kind] += 1
        self.events.append(what)

    def missed(self, kind: str) -> None:
        self.skipped[kind] += 1


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
    def __init__(self, bed: FaultBed, s3: S3Endpoint, plan: dict[str, Any], folder: Path) -> None:
        self.bed, self.s3, self.plan, self.folder = bed, s3, plan, folder

    def postgres_rows(self) -> int | str:
        """Rows committed in Postgres so far (for the log; the server may be down)."""
        try:
            return len(postgres_ids(self.bed.postgres_direct.conninfo(), self.plan["table"]))
        except Exception as exc:  # noqa: BLE001 - a progress line, not a check
            return f"? ({type(exc).__name__})"

    def verdict(self, *, expected: int, tally: Tally, min_per_kind: int) -> Verdict:
        plan, bed = self.plan, self.bed
        rows: list[tuple[str, str, bool]] = []
        for kind in tally.kinds:
            count = tally.counts[kind]
            note = (
                f" ({tally.skipped[kind]} moments with nothing to act on)"
                if tally.skipped[kind]
                else ""
            )
            rows.append((f"fault: {kind}", f"{count} times{note}", count >= min_per_kind))
        rows.append(("rows fed", str(expected), expected > 0))
        dsn = bed.postgres_direct.conninfo()
        rows += counted("Postgres", postgres_ids(dsn, plan["table"]), expected)
        rows += counted("S3", s3_committed_ids(self.s3, plan["s3"]["path"]), expected)
        if plan["mode"] == "driver":
            rows += counted(
                "Kafka (read_committed)", kafka_ids(bed.kafka_direct, plan["topic"]), expected
            )
            mine = job_prefix(plan["job_id"])
            open_ids = [
                t.transactional_id
                for t in bed.open_kafka_transactions()
                if t.transactional_id.startswith(mine)
            ]
            stuck = kafka_open_transactions(bed.kafka_direct, plan["topic"])
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
        prepared = [
            t.gid
            for t in bed.prepared_transactions()
            if t.gid.startswith(job_prefix(plan["job_id"]))
        ]
        rows.append(("prepared Postgres transactions left", str(len(prepared)), not prepared))
        prefix = plan["s3"]["path"].split("/", 3)[3]
        uploads = incomplete_uploads(self.s3.client(), self.s3.bucket, prefix)
        rows.append(("incomplete S3 uploads left", str(len(uploads)), not uploads))
        return Verdict(rows)
