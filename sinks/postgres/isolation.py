"""Dead-letter mode: the rows of a batch the table's own rules refuse, found set-based once a
COPY of the batch has failed (load.PostgresParticipant.copy_isolating).

The columns the rules read are COPYed, with each row's number, into an UNLOGGED staging table
made under the epoch's savepoint (the target's column types, none of its constraints) and
rolled back with it. The rules are then checked against it: each foreign key to another table
(an anti-join with the referenced table), each CHECK constraint (its expression on the staged
rows), and, when asked, each unique index on plain columns (keys already in the table, then
keys twice in the batch: the later rows). The caller COPYs the rows left; what still fails
then (a trigger, an exclusion constraint, a self-referencing key, a domain) is found by
COPYing pieces.

Why: one COPY fails on one row, and a foreign key is checked only at the end of the COPY, so
finding many bad rows by COPYing pieces again costs many times the batch; the staged checks
cost a COPY of a few columns into a table without indexes plus one query per rule
(docs/benchmarks.md, "What do bad rows cost the Postgres sink?").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from durable_sinks.core.bad_rows import Refusal, RefusalReason

if TYPE_CHECKING:
    import pyarrow as pa

#: The staging table's column holding each row's index in the batch.
ROW = "ds_row"


@dataclass(frozen=True)
class Rule:
    """One of the table's rules checked on the staged rows: `query` selects the rows (their
    ROW) that break it."""

    refusal: Refusal
    query: sql.Composed
    #: The batch columns it reads.
    columns: tuple[str, ...]
    #: A unique key: checked after the other rules, among the rows they leave.
    unique: bool = False


def stage_name(participant: str) -> str:
    return f"ds_isolate_{hashlib.sha256(participant.encode()).hexdigest()[:24]}"


def rules(
    conn: psycopg.Connection[Any],
    target: sql.Identifier,
    qualified: str,
    table_name: str,
    stage: sql.Identifier,
    columns: list[str],
) -> list[Rule]:
    """The rules of table `qualified` that can be checked on a staging table holding the
    batch's `columns`: those whose columns the batch all has."""
    have = set(columns)
    found: list[Rule] = []
    for name, kind, keys, ref_schema, ref_table, ref_keys, expression in conn.execute(
        """
        SELECT c.conname::text, c.contype::text,
               ARRAY(SELECT a.attname::text FROM unnest(c.conkey) WITH ORDINALITY k(n, i)
                     JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n
                     ORDER BY k.i),
               rn.nspname::text, r.relname::text,
               ARRAY(SELECT a.attname::text FROM unnest(c.confkey) WITH ORDINALITY k(n, i)
                     JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n
                     ORDER BY k.i),
               CASE WHEN c.contype = 'c' THEN pg_get_expr(c.conbin, c.conrelid) END
        FROM pg_constraint c
        LEFT JOIN pg_class r ON r.oid = c.confrelid
        LEFT JOIN pg_namespace rn ON rn.oid = r.relnamespace
        WHERE c.conrelid = %s::regclass AND c.contype IN ('f', 'c')
          AND (c.contype <> 'f' OR c.confrelid <> c.conrelid)
        ORDER BY c.conname
        """,
        (qualified,),
    ).fetchall():
        if not keys or not set(keys) <= have:
            continue  # a column the batch lacks takes its default: not judged here
        staged = [sql.SQL("s.{}").format(sql.Identifier(k)) for k in keys]
        if kind == "f":
            refusal = Refusal(
                RefusalReason.FOREIGN_KEY,
                f'insert or update on table "{table_name}" violates foreign key constraint '
                f'"{name}" (SQLSTATE 23503)',
                column=keys[0] if len(keys) == 1 else None,
                constraint=name,
            )
            query = sql.SQL(
                "SELECT s.{row} FROM {stage} s WHERE {not_null} AND NOT EXISTS "
                "(SELECT 1 FROM {ref} r WHERE {match})"
            ).format(
                row=sql.Identifier(ROW),
                stage=stage,
                not_null=sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(s) for s in staged),
                ref=sql.Identifier(ref_schema, ref_table),
                match=sql.SQL(" AND ").join(
                    sql.SQL("r.{} = {}").format(sql.Identifier(r), s)
                    for r, s in zip(ref_keys, staged, strict=True)
                ),
            )
        else:
            refusal = Refusal(
                RefusalReason.CHECK,
                f'new row for relation "{table_name}" violates check constraint "{name}" '
                "(SQLSTATE 23514)",
                column=keys[0] if len(keys) == 1 else None,
                constraint=name,
            )
            query = sql.SQL("SELECT {row} FROM {stage} WHERE ({check}) IS FALSE").format(
                row=sql.Identifier(ROW), stage=stage, check=sql.SQL(expression)
            )
        found.append(Rule(refusal, query, tuple(keys)))
    for name, keys in conn.execute(
        """
        SELECT i.indexrelid::regclass::text,
               ARRAY(SELECT a.attname::text FROM unnest(i.indkey) WITH ORDINALITY k(n, o)
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n
                     ORDER BY k.o)
        FROM pg_index i
        WHERE i.indrelid = %s::regclass AND i.indisunique AND i.indpred IS NULL
          AND i.indexprs IS NULL
        ORDER BY 1
        """,
        (qualified,),
    ).fetchall():
        if not keys or not set(keys) <= have:
            continue
        constraint = name.rsplit(".", 1)[-1].strip('"')
        refusal = Refusal(
            RefusalReason.UNIQUE,
            f'duplicate key value violates unique constraint "{constraint}" (SQLSTATE 23505)',
            column=keys[0] if len(keys) == 1 else None,
            constraint=constraint,
        )
        key = sql.SQL(", ").join(map(sql.Identifier, keys))
        not_null = sql.SQL(" AND ").join(
            sql.SQL("{} IS NOT NULL").format(sql.Identifier(k)) for k in keys
        )
        # Keys already in the table, then keys twice among the rows left: the later rows.
        query = sql.SQL(
            "SELECT s.{row} FROM {stage} s WHERE EXISTS (SELECT 1 FROM {target} t WHERE {match}) "
            "UNION ALL SELECT d.{row} FROM (SELECT {row}, row_number() OVER (PARTITION BY {key} "
            "ORDER BY {row}) AS n FROM {stage} WHERE {not_null}) d WHERE d.n > 1"
        ).format(
            row=sql.Identifier(ROW),
            stage=stage,
            target=target,
            match=sql.SQL(" AND ").join(
                sql.SQL("t.{0} = s.{0}").format(sql.Identifier(k)) for k in keys
            ),
            key=key,
            not_null=not_null,
        )
        found.append(Rule(refusal, query, tuple(keys), unique=True))
    return found


def refused_by_rules(
    conn: psycopg.Connection[Any], found: list[Rule], stage: sql.Identifier
) -> dict[int, Refusal]:
    """The staged rows the rules refuse (row -> refusal): foreign keys and checks first, then
    each unique key among the rows left (a row refused for another reason is not inserted,
    so its key is free: refused rows are deleted from `stage` before the next rule)."""
    refused: dict[int, Refusal] = {}
    delete = sql.SQL("DELETE FROM {} s USING unnest(%s::bigint[]) AS u(r) WHERE s.{} = u.r").format(
        stage, sql.Identifier(ROW)
    )
    checks = [r for r in found if not r.unique]
    groups = [checks, *([r] for r in found if r.unique)]
    for number, group in enumerate(groups, 1):
        now: list[int] = []
        for rule in group:
            for (row,) in conn.execute(rule.query).fetchall():
                if int(row) not in refused:
                    refused[int(row)] = rule.refusal
                    now.append(int(row))
        if now and number < len(groups):  # the next group judges the rows left
            conn.execute(delete, (now,))
    return refused


def with_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with a last column ROW: each row's index."""
    import pyarrow as pa

    return batch.append_column(ROW, pa.array(range(batch.num_rows), pa.int64()))
