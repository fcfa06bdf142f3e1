"""Conformance-suite targets: the local sinks (files, the journal last resource) and the test
bed's Postgres and Kafka, each read as its own readers would."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
from confluent_kafka import Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from durable_sinks.core import SinkConnector
from durable_sinks.core.naming import owner_prefix
from durable_sinks.sinks.folder import STAGING, Files, FolderSink
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.kafka.admin import list_offsets
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from durable_sinks.testing import COLUMNS, BadRows, Row
from tests.services import KafkaEndpoint, PostgresEndpoint

from .journal_sink import JournalSink


class FileTarget:
    """A FolderSink's folder, read as its readers would: published Parquet files only (the
    conformance suite's COLUMNS; `columns=DEAD_LETTER_COLUMNS` for a dead-letter target).
    `bad_rows` says what its sink class refuses (durable_sinks.testing.BadRows)."""

    def __init__(
        self,
        path: Path,
        name: str = "files",
        sink_class: type[FolderSink] = FolderSink,
        *,
        columns: Sequence[str] = COLUMNS,
        bad_rows: BadRows | None = None,
    ):
        self.path = path
        self.name = name
        self.sink_class = sink_class
        self.columns = list(columns)
        self.bad_rows = bad_rows
        self._cache: dict[tuple[str, int, int, int], list[Row]] = {}

    def connector(self) -> SinkConnector:
        return self.sink_class(Files(str(self.path), name=self.name))

    def committed_rows(self) -> list[Row]:
        rows: list[Row] = []
        for file in sorted(self.path.glob("epoch=*/part=*/*.parquet")):
            stat = file.stat()
            key = (str(file), stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if key not in self._cache:  # published files never change: read each once
                table = pq.read_table(file).select(self.columns)
                self._cache[key] = [tuple(r[c] for c in self.columns) for r in table.to_pylist()]
            rows.extend(self._cache[key])
        return rows

    def leftovers(self) -> list[str]:
        staging = self.path / STAGING
        return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


class JournalTarget:
    """A JournalSink's folder: committed segments only (its prepared state is in memory)."""

    def __init__(self, path: Path, name: str = "journal") -> None:
        self.path = path
        self.name = name

    def connector(self) -> SinkConnector:
        return JournalSink(self.path, name=self.name)

    def committed_rows(self) -> list[Row]:
        return JournalSink.read_rows(self.path)

    def leftovers(self) -> list[str]:
        return []  # nothing of a journal epoch exists outside memory before its commit


class PostgresTarget:
    """A fresh table (and job) in the test's schema; readers see committed rows only.

    `definition` gives the table's columns (the conformance suite's by default) and
    `bad_rows` what its constraints refuse; `columns` are what `committed_rows` reads.
    With `definition=None` the table is not created here: the sink creates it from the first
    batch (create_table=True), as a dead-letter table is (`columns=DEAD_LETTER_COLUMNS`)."""

    def __init__(
        self,
        endpoint: PostgresEndpoint,
        schema: str,
        job_id: str,
        name: str = "postgres",
        *,
        definition: str | None = (
            "key text PRIMARY KEY, n bigint, text text, x double precision, flag boolean"
        ),
        columns: Sequence[str] = COLUMNS,
        bad_rows: BadRows | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.schema = schema
        self.job_id = job_id
        self.name = name
        self.columns = tuple(columns)
        self.bad_rows = bad_rows
        self.create_table = definition is None
        self.table = f"t_{uuid.uuid4().hex[:12]}"
        if definition is not None:
            with psycopg.connect(endpoint.conninfo(), autocommit=True) as conn:
                conn.execute(
                    sql.SQL("CREATE TABLE {} ({})").format(self._ident(), sql.SQL(definition))
                )
        self._conn = psycopg.connect(endpoint.conninfo(), autocommit=True)

    def _ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.table)

    def connector(self) -> SinkConnector:
        return PostgresSink(
            Postgres(
                self.endpoint.conninfo(),
                f"{self.schema}.{self.table}",
                name=self.name,
                create_table=self.create_table,
            )
        )

    def committed_rows(self) -> list[Row]:
        exists = self._conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f'"{self.schema}"."{self.table}"',)
        ).fetchone()
        if not (exists and exists[0]):
            return []  # created with the first batch (create_table)
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(map(sql.Identifier, self.columns)), self._ident()
        )
        return [tuple(r) for r in self._conn.execute(query).fetchall()]

    def leftovers(self) -> list[str]:
        return prepared_gids(self._conn, self.job_id, self.name)

    def cleanup(self) -> None:
        for gid in self.leftovers():
            self._conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        self._conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._ident()))
        self._conn.close()


def prepared_gids(conn: psycopg.Connection[Any], job_id: str, sink: str) -> list[str]:
    rows = conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s) ORDER BY gid",
        (owner_prefix(job_id, sink),),
    ).fetchall()
    return [r[0] for r in rows]


def create_topic(admin: AdminClient, name: str, partitions: int = 1, **config: str) -> None:
    """Create a topic and wait until every partition has a leader."""
    futures = admin.create_topics([NewTopic(name, partitions, config=config)], request_timeout=30)
    for future in futures.values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=10).topics.get(name)
        if (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
        ):
            return
        time.sleep(0.05)
    raise AssertionError(f"topic {name} has no leader after 30 s")


def delete_with_progress(admin: AdminClient, topic: str) -> None:
    """Delete `topic` and the Kafka sink's progress topic beside it (`<topic>-ds-progress`),
    whichever exist."""
    existing = set(admin.list_topics(timeout=30).topics)
    names = [n for n in (topic, f"{topic}-ds-progress") if n in existing]
    for future in admin.delete_topics(names, request_timeout=30).values():
        future.result(timeout=30)


def open_transactions(
    admin: AdminClient, partitions: list[TopicPartition], grace: float = 5.0
) -> list[str]:
    """Partitions whose last stable offset stays below the high watermark for `grace`
    seconds: a transaction left open. (Commit markers land a moment after
    commit_transaction returns; a transaction really left open lasts until the broker's
    transaction.timeout.ms, far longer than `grace`.)"""
    deadline = time.monotonic() + grace
    while True:
        high = list_offsets(admin, partitions, IsolationLevel.READ_UNCOMMITTED, 20)
        stable = list_offsets(admin, partitions, IsolationLevel.READ_COMMITTED, 20)
        lagging = [
            f"{p.topic}[{p.partition}]: open transaction (LSO {stable[p]} < {high[p]})"
            for p in partitions
            if stable[p] < high[p]
        ]
        if not lagging or time.monotonic() > deadline:
            return lagging
        time.sleep(0.05)


class KafkaTarget:
    """A fresh topic (two partitions, records keyed by the row key, the other columns as a
    JSON value), read by a read_committed consumer: aborted or open transactions' records
    must stay invisible. Progress records go to `progress_topic` (shared by a test's
    examples: they are keyed by job)."""

    PARTITIONS = 2

    def __init__(
        self,
        endpoint: KafkaEndpoint,
        admin: AdminClient,
        progress_topic: str,
        name: str = "kafka",
    ) -> None:
        self.endpoint = endpoint
        self.admin = admin
        self.progress_topic = progress_topic
        self.name = name
        self.topic = f"kconf-{uuid.uuid4().hex[:12]}"
        create_topic(admin, self.topic, self.PARTITIONS)
        self.partitions = [TopicPartition(self.topic, p) for p in range(self.PARTITIONS)]
        self._consumer = Consumer(
            endpoint.config(
                {
                    "group.id": "conformance-reader",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.wait.max.ms": 10,
                }
            )
        )
        self._consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.PARTITIONS)])
        self._rows: list[Row] = []

    def config(self) -> Kafka:
        return Kafka(
            self.endpoint.bootstrap_servers,
            self.topic,
            name=self.name,
            key_column="key",
            progress_topic=self.progress_topic,
            request_timeout_s=20,
        )

    def connector(self) -> SinkConnector:
        return KafkaSink(self.config())

    def committed_rows(self) -> list[Row]:
        """Everything up to the last stable offsets, read incrementally (records once
        committed never change)."""
        stable = list_offsets(self.admin, self.partitions, IsolationLevel.READ_COMMITTED, 20)
        deadline = time.monotonic() + 20
        while True:
            # A partition not fetched yet has no position (negative): it starts at 0.
            positions = self._consumer.position(self.partitions)
            if all(
                max(p.offset, 0) >= stable[tp]
                for p, tp in zip(positions, self.partitions, strict=True)
            ):
                return list(self._rows)
            if time.monotonic() > deadline:
                raise AssertionError(f"read_committed reader stuck at {positions}, LSO {stable}")
            for message in self._consumer.consume(num_messages=1000, timeout=0.05):
                error = message.error()
                assert error is None, error
                key, value = message.key(), message.value()
                assert key is not None, message
                assert value is not None, message
                fields = json.loads(value)
                self._rows.append((key.decode(), *(fields[c] for c in COLUMNS[1:])))

    def leftovers(self) -> list[str]:
        """Partitions whose last stable offset lags the high watermark: an open
        transaction (the sink's own, or the progress topic's)."""
        partitions = [*self.partitions, TopicPartition(self.progress_topic, 0)]
        return open_transactions(self.admin, partitions)

    def cleanup(self) -> None:
        self._consumer.close()
        for future in self.admin.delete_topics([self.topic], request_timeout=30).values():
            future.result(timeout=30)
