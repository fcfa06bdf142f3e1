"""The write path of one epoch: Arrow record batches streamed into the epoch's transaction by
binary COPY (encoded by pgpq), straight into the table (append) or into a per-epoch UNLOGGED
staging table merged into the table with INSERT ... ON CONFLICT at pre-commit (upsert).

In dead-letter mode the COPYs run under a savepoint, and a COPY the server refuses is undone
to it while the refused rows are found (`copy_isolating`; isolation.py).

Nothing here commits: every statement runs in the epoch's transaction, which pre-commit
prepares (or one-phase commit commits)."""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

import pgpq
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from durable_sinks.clients.postgres import connection_lost
from durable_sinks.core.bad_rows import Refusal, RefusedRows
from durable_sinks.core.errors import SchemaMismatchError, TransientError
from durable_sinks.core.naming import ParticipantName
from durable_sinks.core.protocol import CommitHandle, OpenContext
from durable_sinks.core.sink_base import OpenParticipant

from .catalog import alter_clauses
from .columns import Evolution
from .config import Postgres
from .errors import ROW_ERRORS, first_line, row_named, server_refusal
from .isolation import ROW, refused_by_rules, rules, stage_name, with_rows

#: Rows encoded per COPY write: small enough to overlap encoding with sending, large enough that
#: per-call overhead does not show (measured in benchmarks/postgres_sink.py).
COPY_SLICE_ROWS = 16_384
#: Dead-letter mode: rows COPYed under one savepoint before a new one is taken. A refused COPY
#: rolls back the batches under its savepoint, which are COPYed again; fewer savepoints keep
#: an epoch within Postgres's cache of 64 subtransactions per session (docs/postgres.md).
GROUP_ROWS = 100_000
#: ... and at most this many bytes of them (they are kept in memory until the next savepoint).
GROUP_BYTES = 32 * 2**20
#: Keys an upsert epoch holds twice that its refusal names.
DUPLICATES_SHOWN = 5


def _all_rows(count: int) -> pa.Array:
    """0, 1, ..., count - 1 as Arrow int64, without a Python loop."""
    return pc.indices_nonzero(pc.is_null(pa.nulls(count))).cast(pa.int64())


class PostgresParticipant(OpenParticipant):
    """What one attempt at an epoch has loaded into its (still open) transaction."""

    def __init__(
        self, epoch: int, name: ParticipantName, config: Postgres, context: OpenContext
    ) -> None:
        super().__init__(epoch, name)
        self.context = context
        self.config = config
        self.table = sql.Identifier(config.schema_name, config.table_name)
        self.rows = 0
        self.bytes = 0
        self.checksum = 0  # CRC-32 of the COPY bytes, for audits
        self.stage: sql.Identifier | None = None
        #: Dead-letter mode: the savepoint the COPYs run under ("none" before the first,
        #: "empty" when nothing was written since it was set or rolled back to, "used").
        self.savepoint = "none"
        #: The batches COPYed under the savepoint since it was set: a refused COPY rolls
        #: them back with it, and they are COPYed again (GROUP_ROWS bounds them).
        self.group: list[pa.RecordBatch] = []
        #: Take a new savepoint before the next COPY (what ran since, e.g. schema evolution's
        #: ALTER, must not be rolled back with a later refused COPY).
        self.seal_next = False
        #: Whether batches share a savepoint: until the first refused COPY of the epoch
        #: (refusals come in runs, and each would write the batches under it again).
        self.grouping = True
        #: COPYs that the server refused in dead-letter mode (each then split and retried).
        self.isolation_copies = 0
        #: Strings a refusal's message must not show (the DSN's passwords).
        self.secrets: tuple[str, ...] = ()
        #: Set by pre_commit in one-phase mode: the transaction waits for commit_with_decision.
        self.handle: CommitHandle | None = None
        #: The session whose transaction holds the epoch (set by begin_epoch).
        self.session: psycopg.Connection[Any] | None = None

    def conn(self) -> psycopg.Connection[Any]:
        """The epoch's session. The transaction lives and dies with it: once the session is
        lost, every statement fails (psycopg: "the connection is closed") instead of going
        to a new session that lacks the epoch's rows."""
        assert self.session is not None, "begin_epoch sets the session"
        return self.session

    @property
    def checksum_text(self) -> str:
        return f"crc32:{self.checksum:08x}"

    def copy(self, conn: psycopg.Connection[Any], batch: pa.RecordBatch) -> int:
        """COPY `batch` into the table (append) or the epoch's staging table (upsert); return
        the bytes sent. The caller has left out the rows `columns.bad_values` refuses; an
        error of the server aborts the epoch's transaction (fail mode)."""
        target = self._staging(conn) if self.config.mode == "upsert" else self.table
        sent, self.checksum = self._send(conn, batch, self.checksum, target)
        self.rows += batch.num_rows
        self.bytes += sent
        return sent

    def copy_isolating(
        self, conn: psycopg.Connection[Any], batch: pa.RecordBatch
    ) -> tuple[int, int, RefusedRows]:
        """Dead-letter mode: COPY `batch` under a savepoint; when the server refuses rows of
        it (errors.ROW_ERRORS), roll back to the savepoint, find the rows the table's rules
        refuse on a staging table (isolation.py), COPY the others; if that fails too (a
        trigger, an exclusion constraint, ...), COPY them in pieces until each refused row is
        found alone. Returns (rows written, bytes sent, refused rows by index in `batch`).
        The epoch's transaction holds exactly the rows written; the others were rolled back
        with their savepoint."""
        try:
            return self._copy_under_savepoint(conn, batch)
        except ROW_ERRORS as exc:
            error: psycopg.Error = exc
        # Unique keys are checked on the stage only once a key was refused: the check costs
        # as much as the others together, and a key twice is rarer than the rest.
        unique = isinstance(error, psycopg.errors.UniqueViolation)
        refused: dict[int, Refusal] = {}
        index = _all_rows(batch.num_rows)  # rows of `rest` -> rows of `batch`
        rest = batch
        while True:
            by_rules = self._refused_by_rules(conn, rest, unique=unique)
            if not by_rules:
                # Cannot stage, or the rules refuse none of the rows (COPYing them again
                # would fail as before): find them by COPYing pieces.
                break
            refused.update((index[i].as_py(), why) for i, why in by_rules.items())
            kept = pc.indices_nonzero(
                pc.invert(pc.is_in(_all_rows(rest.num_rows), pa.array(list(by_rules), pa.int64())))
            )
            index = index.take(kept)
            rest = rest.take(kept)
            if rest.num_rows == 0:
                return 0, 0, RefusedRows.of(refused.items())
            try:
                rows, sent, _ = self._copy_under_savepoint(conn, rest)
                return rows, sent, RefusedRows.of(refused.items())
            except ROW_ERRORS as exc:
                error = exc
            if unique or not isinstance(error, psycopg.errors.UniqueViolation):
                break
            unique = True
        rows, sent, more = self._isolate_by_copies(conn, rest, error)
        by_copies = more.through(index.to_pylist()) if more else more
        return rows, sent, RefusedRows.of(refused.items()).merged(by_copies)

    def _copy_under_savepoint(
        self, conn: psycopg.Connection[Any], batch: pa.RecordBatch, *, alone: bool = False
    ) -> tuple[int, int, RefusedRows]:
        """COPY `batch` under the savepoint (a new one first when `alone`, or when the
        batches under the current one hold GROUP_ROWS rows). On a refusal (raised), roll back
        to it, COPY again the batches that were under it, and leave an empty savepoint."""
        self._savepoint(conn, alone=alone)
        try:
            sent, checksum = self._send(conn, batch, self.checksum, self.table)
        except ROW_ERRORS:
            conn.execute("ROLLBACK TO SAVEPOINT ds_rows")  # stays, empty
            self.savepoint = "empty"
            self.isolation_copies += 1
            self.grouping = False
            if self.group:
                # Written and reported before: the same rows again, then sealed.
                try:
                    for earlier in self.group:
                        self._send(conn, earlier, 0, self.table)
                except ROW_ERRORS as exc:
                    raise TransientError(
                        f"rows of epoch {self.epoch} the server took before were refused when "
                        f"written again after a refused COPY: {first_line(exc)}",
                        job=self.context.job_id,
                        sink=self.context.sink,
                        epoch=self.epoch,
                        fix="another writer changed the table meanwhile (e.g. took a key): "
                        "the epoch is written again; nothing of it was committed",
                    ) from exc
                self.group = []
                conn.execute("RELEASE SAVEPOINT ds_rows; SAVEPOINT ds_rows")
            raise
        self.savepoint = "used"
        self.group.append(batch)
        self.checksum = checksum
        self.rows += batch.num_rows
        self.bytes += sent
        return batch.num_rows, sent, RefusedRows()

    def _refused_by_rules(
        self, conn: psycopg.Connection[Any], batch: pa.RecordBatch, *, unique: bool
    ) -> dict[int, Refusal] | None:
        """The rows of `batch` the table's foreign keys and checks (and unique keys, with
        `unique`) refuse, found on a staging table of the columns they read, made under the
        (empty) savepoint and rolled back with it; {} when no rule applies to the batch's
        columns. None when the server refused any of it (a value the column types refuse, no
        CREATE on the table's schema, no SELECT on a referenced table): nothing of it stays.
        A lost session is raised."""
        stage = sql.Identifier(self.config.schema_name, stage_name(str(self.name)))
        found = [
            rule
            for rule in rules(
                conn,
                self.table,
                self.config.qualified,
                self.config.table_name,
                stage,
                batch.schema.names,
            )
            if unique or not rule.unique
        ]
        if not found:
            return {}
        names = [n for n in batch.schema.names if any(n in rule.columns for rule in found)]
        try:
            conn.execute(
                sql.SQL(
                    "CREATE UNLOGGED TABLE {} AS SELECT {}, NULL::bigint AS {} FROM {} WITH NO DATA"
                ).format(
                    stage,
                    sql.SQL(", ").join(map(sql.Identifier, names)),
                    sql.Identifier(ROW),
                    self.table,
                )
            )
            self._send(conn, with_rows(batch.select(names)), 0, stage)
            refused = refused_by_rules(conn, found, stage)
        except psycopg.Error as exc:
            # A value the column types refuse, no CREATE on the schema, no SELECT on a
            # referenced table, a column named like the row numbers: COPY pieces instead.
            if connection_lost(exc):
                raise
            conn.execute("ROLLBACK TO SAVEPOINT ds_rows")
            return None
        conn.execute("ROLLBACK TO SAVEPOINT ds_rows")  # the staging table goes with it
        return refused

    def _isolate_by_copies(
        self, conn: psycopg.Connection[Any], batch: pa.RecordBatch, error: psycopg.Error
    ) -> tuple[int, int, RefusedRows]:
        """COPY the rows again in pieces, each under the savepoint, until every refused row
        is found alone: a piece whose error names its row (a value, NOT NULL, unique, check,
        exclusion: raised while that row is inserted) is split around that row, which is
        refused; any other (a foreign key, checked at the end of the COPY) in halves.
        `error` is what the COPY of the whole batch raised."""
        refused: list[tuple[int, Refusal]] = []
        rows = sent = 0
        pieces: list[tuple[int, int]] = []
        failed: tuple[int, int, psycopg.Error] | None = (0, batch.num_rows, error)
        while failed is not None or pieces:
            if failed is None:
                first, end = pieces.pop()
                try:
                    _, piece_sent, _ = self._copy_under_savepoint(
                        conn, batch.slice(first, end - first), alone=True
                    )
                except ROW_ERRORS as refusal:
                    failed = (first, end, refusal)
                    continue
                rows += end - first
                sent += piece_sent
                continue
            first, end, why = failed
            failed = None
            named = row_named(why, end - first)
            if end - first == 1 or named is not None:
                bad = first + (named or 0)
                refused.append((bad, server_refusal(why, self.secrets)))
                pieces.extend(p for p in ((bad + 1, end), (first, bad)) if p[0] < p[1])
            else:
                middle = (first + end) // 2
                pieces.extend(((middle, end), (first, middle)))
        return rows, sent, RefusedRows.of(refused)

    def _savepoint(self, conn: psycopg.Connection[Any], *, alone: bool = False) -> None:
        """The savepoint for the next COPY: kept while the batches under it hold fewer than
        GROUP_ROWS rows and GROUP_BYTES bytes (each savepoint is a subtransaction, and
        Postgres caches only 64 of them per session), else released and a new one taken (one
        round trip); none after a rollback to it, which leaves it in place and empty.
        `alone`: a new one unless empty."""
        if self.savepoint == "none":
            conn.execute("SAVEPOINT ds_rows")
        elif self.seal_next or (
            self.savepoint == "used"
            and (
                alone
                or not self.grouping
                or sum(b.num_rows for b in self.group) >= GROUP_ROWS
                or sum(b.nbytes for b in self.group) >= GROUP_BYTES
            )
        ):
            conn.execute("RELEASE SAVEPOINT ds_rows; SAVEPOINT ds_rows")
        else:
            return
        self.savepoint = "empty"
        self.group = []
        self.seal_next = False

    def _send(
        self,
        conn: psycopg.Connection[Any],
        batch: pa.RecordBatch,
        checksum: int,
        target: sql.Identifier,
    ) -> tuple[int, int]:
        """One COPY of `batch` into `target`: (bytes sent, `checksum` extended with them).
        Encodes slice by slice into one COPY, so the server parses one slice while the next
        is encoded (psycopg's writer thread measured slower: it contends for the GIL with the
        encoding)."""
        copy_sql = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT binary)").format(
            target, sql.SQL(", ").join(map(sql.Identifier, batch.schema.names))
        )
        encoder = pgpq.ArrowToPostgresBinaryEncoder(batch.schema)
        sent = 0
        with conn.cursor() as cur, cur.copy(copy_sql) as copy:
            header = encoder.write_header()
            for offset in range(0, batch.num_rows, COPY_SLICE_ROWS):
                chunk = encoder.write_batch(batch.slice(offset, COPY_SLICE_ROWS))
                if offset == 0:
                    chunk = header + chunk
                if offset + COPY_SLICE_ROWS >= batch.num_rows:
                    chunk += encoder.finish()
                checksum = zlib.crc32(chunk, checksum)
                copy.write(chunk)
                sent += len(chunk)
        return sent, checksum

    def _staging(self, conn: psycopg.Connection[Any]) -> sql.Identifier:
        """The epoch's UNLOGGED staging table (upsert mode), created in the epoch's
        transaction (TEMP tables cannot be prepared) and named after the participant."""
        if self.stage is None:
            digest = hashlib.sha256(str(self.name).encode()).hexdigest()[:24]
            self.stage = sql.Identifier(self.config.schema_name, f"ds_stage_{digest}")
            conn.execute(
                sql.SQL("CREATE UNLOGGED TABLE {} (LIKE {} INCLUDING DEFAULTS)").format(
                    self.stage, self.table
                )
            )
        return self.stage

    def evolve_stage(self, conn: psycopg.Connection[Any], changes: list[Evolution]) -> None:
        """Upsert mode: make schema evolution's `changes` to the epoch's staging table too,
        when it exists (it was made LIKE the table before them)."""
        if self.stage is not None:
            conn.execute(sql.SQL("ALTER TABLE {} {}").format(self.stage, alter_clauses(changes)))

    def merge(self, conn: psycopg.Connection[Any], columns: list[str]) -> None:
        """Upsert mode, at pre-commit: merge the staging table into the table on the key
        and drop it (a key twice in one epoch is refused by Postgres). Nothing to do when
        nothing was staged."""
        if self.stage is None:
            return
        updates = [n for n in columns if n not in self.config.key]
        action = (
            sql.SQL("DO UPDATE SET {}").format(
                sql.SQL(", ").join(
                    sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n)) for n in updates
                )
            )
            if updates
            else sql.SQL("DO NOTHING")
        )
        names = sql.SQL(", ").join(map(sql.Identifier, columns))
        # The savepoint (sent with the merge, one round trip) keeps the staging table readable
        # when the merge fails on a key the epoch holds twice, to name those keys.
        merge = sql.SQL(
            "SAVEPOINT ds_merge; INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) {}"
        ).format(
            self.table,
            names,
            names,
            self.stage,
            sql.SQL(", ").join(map(sql.Identifier, self.config.key)),
            action,
        )
        try:
            conn.execute(merge)
        except psycopg.errors.CardinalityViolation:
            conn.execute("ROLLBACK TO SAVEPOINT ds_merge")
            raise self._duplicate_keys(conn) from None
        conn.execute(sql.SQL("DROP TABLE {}").format(self.stage))

    def _duplicate_keys(self, conn: psycopg.Connection[Any]) -> SchemaMismatchError:
        """The refusal of an upsert epoch holding a key more than once, naming up to
        DUPLICATES_SHOWN of those keys (read from the staging table)."""
        assert self.stage is not None
        key = self.config.key
        found = conn.execute(
            sql.SQL(
                "SELECT {k}, count(*), count(*) OVER () FROM {s} GROUP BY {k} "
                "HAVING count(*) > 1 ORDER BY count(*) DESC, {k} LIMIT {n}"
            ).format(
                k=sql.SQL(", ").join(map(sql.Identifier, key)),
                s=self.stage,
                n=sql.Literal(DUPLICATES_SHOWN),
            )
        ).fetchall()
        total = found[0][-1] if found else 0
        shown = "; ".join(
            ", ".join(f"{k}={v!r}" for k, v in zip(key, row[: len(key)], strict=True))
            + f" ({row[len(key)]} rows)"
            for row in found
        )
        listed = ", ".join(f'"{k}"' for k in key)
        return SchemaMismatchError(
            f"the epoch holds {total} upsert key(s) more than once, which one INSERT ... ON "
            f"CONFLICT cannot merge (Postgres: cannot affect row a second time): {shown}"
            + ("; ..." if total > len(found) else ""),
            job=self.context.job_id,
            sink=self.context.sink,
            epoch=self.epoch,
            fix=f"deduplicate by key in the query, e.g. df.dropDuplicates([{listed}]), or keep "
            f"the latest row per key with a window (row_number() over (partition by "
            f"{', '.join(key)} order by <event time> desc) = 1); nothing of the epoch was "
            "committed",
        )
