"""A stream that carries rows of every kind a Postgres table refuses, mixed into good rows,
for the Spark crash tests with a dead-letter table (tests/spark/test_crash.py).

Each row's kind follows from its id (`kind_of`): in every input file of ROWS_PER_FILE rows,
the rows at the positions of BAD_AT break one rule of the table each; every other row is good.
The table (`create_tables`) refuses them for these reasons:

| kind | row | the table |
|---|---|---|
| not_null | `note` null | `note text NOT NULL` |
| nul_character | `body` holds U+0000 | text |
| too_long | `body` of 40 characters | `body varchar(16)` |
| out_of_range | `amount` 123456789.00 | `amount numeric(6,2)` |
| timestamp_out_of_range | `ts` about 7500 BC | timestamptz (from 4713 BC) |
| foreign_key | `ref` 999 | `ref REFERENCES <parent>(id)`, parent holds 1 only |
| unique | `code` 'taken' | a unique index on `code` = 'taken', a seed row (id -1) holds it |
| check | `qty` -1 | `CHECK (qty >= 0)` |

The unique index covers the value 'taken' only: a unique index over every row's `code` would
make the retried attempt of a task (executor mode) wait on the keys its dead first attempt
holds in a prepared transaction, which only the driver's decision ends, after the retry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

#: Rows per input file (one file per micro-batch: file n is epoch n).
ROWS_PER_FILE = 20
#: Position in its file (id % ROWS_PER_FILE) -> the reason the table refuses the row.
BAD_AT = {
    2: "not_null",
    4: "nul_character",
    6: "too_long",
    8: "out_of_range",
    10: "timestamp_out_of_range",
    12: "foreign_key",
    14: "unique",
    16: "check",
}
#: The source's schema: `ts` is read as microseconds and turned into a timestamp in Spark
#: (JSON timestamps stop at year 1).
SOURCE_SCHEMA = (
    "id LONG, body STRING, note STRING, amount DECIMAL(12,2), ts_us LONG, ref LONG, "
    "code STRING, qty LONG"
)
#: About 7530 BC: a timestamp Spark holds and Postgres does not (it starts at 4713 BC).
ANCIENT_US = -300_000_000_000_000_000


def kind_of(row_id: int) -> str | None:
    """Why the table refuses row `row_id` (a RefusalReason value), or None: a good row."""
    return BAD_AT.get(row_id % ROWS_PER_FILE)


def source_row(row_id: int) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": row_id,
        "body": f"row {row_id}",
        "note": "ok",
        "amount": 1.5,
        "ts_us": row_id * 1_000_000,
        "ref": 1,
        "code": f"c{row_id}",
        "qty": row_id,
    }
    kind = kind_of(row_id)
    if kind == "not_null":
        row["note"] = None
    elif kind == "nul_character":
        row["body"] = "nul\x00here"
    elif kind == "too_long":
        row["body"] = "x" * 40
    elif kind == "out_of_range":
        row["amount"] = 123456789.0
    elif kind == "timestamp_out_of_range":
        row["ts_us"] = ANCIENT_US
    elif kind == "foreign_key":
        row["ref"] = 999
    elif kind == "unique":
        row["code"] = "taken"
    elif kind == "check":
        row["qty"] = -1
    return row


def write_input(folder: Path, name: str, ids: range) -> None:
    """One JSON-lines file of the source, renamed into place."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(source_row(i)) for i in ids]
    staging = folder.parent / f".{folder.name}-{name}"
    staging.write_text("\n".join(lines) + "\n")
    staging.rename(folder / name)


def source_stream(spark: Any, folder: Path) -> Any:
    """The files of `folder` as a stream, one file per micro-batch, `ts` a timestamp."""
    from pyspark.sql import functions

    stream = (
        spark.readStream.schema(SOURCE_SCHEMA).option("maxFilesPerTrigger", 1).json(str(folder))
    )
    return stream.select(
        "id",
        "body",
        "note",
        "amount",
        functions.timestamp_micros("ts_us").alias("ts"),
        "ref",
        "code",
        "qty",
    )


def create_tables(dsn: str, schema: str) -> tuple[str, str]:
    """The target table (with its parent and seed row) and the dead-letter table, in
    `schema`; returns their names (`schema.table`)."""
    events, letters = f"{schema}.events", f"{schema}.dead_letters"
    with psycopg.connect(dsn, autocommit=True) as conn:
        parent = sql.Identifier(schema, "parents")
        table = sql.Identifier(schema, "events")
        conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY)").format(parent))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(parent))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint, body varchar(16), note text NOT NULL, "
                "amount numeric(6,2), ts timestamptz, ref bigint REFERENCES {} (id), "
                "code text, qty bigint CONSTRAINT qty_not_negative CHECK (qty >= 0))"
            ).format(table, parent)
        )
        conn.execute(
            sql.SQL("CREATE UNIQUE INDEX code_taken_once ON {} (code) WHERE code = 'taken'").format(
                table
            )
        )
        conn.execute(
            sql.SQL("INSERT INTO {} (id, note, code) VALUES (-1, 'seed', 'taken')").format(table)
        )
        # The dead-letter table, created before the job (executor mode's workers create
        # nothing): the columns of core/bad_rows.dead_letter_schema.
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (job_id text NOT NULL, epoch bigint NOT NULL, "
                "sink text NOT NULL, part text NOT NULL, row_number bigint NOT NULL, "
                "reason text NOT NULL, column_name text, constraint_name text, "
                "message text NOT NULL, row_json text NOT NULL)"
            ).format(sql.Identifier(schema, "dead_letters"))
        )
    return events, letters


def target_ids(dsn: str, table: str) -> list[int]:
    """The ids of the target's rows written by the job (the seed row left out), sorted."""
    schema, name = table.split(".")
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT id FROM {} WHERE id >= 0 ORDER BY id").format(
            sql.Identifier(schema, name)
        )
        return [int(r[0]) for r in conn.execute(query).fetchall()]


def dead_letters(dsn: str, table: str) -> list[dict[str, Any]]:
    """Every committed dead letter, its `row_json` parsed (`row`)."""
    schema, name = table.split(".")
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = sql.SQL(
            "SELECT job_id, epoch, sink, part, row_number, reason, column_name, "
            "constraint_name, message, row_json FROM {}"
        ).format(sql.Identifier(schema, name))
        cursor = conn.execute(query)
        names = [c.name for c in cursor.description or []]
        letters = [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
    for letter in letters:
        letter["row"] = json.loads(letter["row_json"])
    return letters


def check_every_row_in_one_place(
    ids: list[int], letters: list[dict[str, Any]], rows: int, job_id: str, context: str
) -> None:
    """Every row of the input (ids 0 .. rows-1) is in exactly one of the target (`ids`) and
    the dead letter (`letters`): the good ones in the target once, the bad ones in the dead
    letter once, each naming the job, the sink and the reason of its kind, with a message;
    the dead letters of one input file all in one epoch, its own."""
    good = [i for i in range(rows) if kind_of(i) is None]
    bad = {i: kind_of(i) for i in range(rows) if kind_of(i) is not None}
    assert len(ids) == len(set(ids)), f"duplicates in the target ({context})"
    assert not set(ids) & set(bad), (
        f"refused rows in the target ({context}): {sorted(set(ids) & set(bad))[:10]}"
    )
    assert ids == good, (
        f"good rows lost ({context}): {sorted(set(good) - set(ids))[:10]}, "
        f"unexpected: {sorted(set(ids) - set(good))[:10]}"
    )
    lettered = [int(letter["row"]["id"]) for letter in letters]
    twice = sorted({i for i in lettered if lettered.count(i) > 1})
    assert not twice, f"dead letters duplicated ({context}): {twice[:10]}"
    assert sorted(lettered) == sorted(bad), (
        f"bad rows lost ({context}): {sorted(set(bad) - set(lettered))[:10]}, "
        f"unexpected dead letters: {sorted(set(lettered) - set(bad))[:10]}"
    )
    wrong = [
        (int(letter["row"]["id"]), letter["reason"], bad[int(letter["row"]["id"])])
        for letter in letters
        if letter["reason"] != bad[int(letter["row"]["id"])]
    ]
    assert not wrong, f"dead letters with the wrong reason (id, got, expected) ({context}): {wrong}"
    epochs: dict[int, set[int]] = {}
    for letter in letters:
        assert letter["job_id"] == job_id, letter
        assert letter["sink"] == "postgres", letter
        assert letter["message"], letter
        epochs.setdefault(int(letter["row"]["id"]) // ROWS_PER_FILE, set()).add(letter["epoch"])
    # One file per batch (which file a batch reads is Spark's choice among equal times).
    assert all(len(e) == 1 for e in epochs.values()), f"a file's rows in several epochs: {epochs}"
    assert len({e for (e,) in epochs.values()}) == len(epochs), f"files share epochs: {epochs}"
