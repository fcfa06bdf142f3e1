"""A Postgres target with a Postgres dead-letter table (created from dead_letter_schema()),
against the test bed's real Postgres: every kind of bad row (refused before COPY, or by the
server) lands in the dead letter with its reason and the good rows in the target, in one
decision; a crash after the participants prepared, then a new coordinator: every row in
exactly one place, nothing twice; over the cap, nothing visible anywhere."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from durable_sinks.coordinator import Coordinator, EpochOutcome, prepare_part
from durable_sinks.core import CommitHandle
from durable_sinks.core.bad_rows import (
    BadRowCap,
    BadRowPolicy,
    TooManyBadRowsError,
    WritePolicy,
)
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from tests.services import PostgresEndpoint
from tests.support.targets import prepared_gids

UTC = timezone.utc
Conn = psycopg.Connection[Any]
AT = datetime(2026, 1, 1, tzinfo=UTC)
FAR = -(2**62)  # microseconds since 1970: long before 4713 BC

#: id -> (parent, name, note, amount, at (us since 1970), score), and the reason it is refused.
ROWS: dict[int, tuple[tuple[Any, ...], str | None]] = {
    1: ((1, "ok", "", "1.0", 0, 1), None),
    2: ((1, None, "", "1.0", 0, 1), "not_null"),
    3: ((1, "toolong", "", "1.0", 0, 1), "too_long"),
    4: ((1, "ok", "a\x00", "1.0", 0, 1), "nul_character"),
    5: ((1, "ok", "", "1000.0", 0, 1), "out_of_range"),
    6: ((1, "ok", "", "1.0", FAR, 1), "timestamp_out_of_range"),
    7: ((9, "ok", "", "1.0", 0, 1), "foreign_key"),
    8: ((1, "ok", "", "1.0", 0, -3), "check"),
    9: ((1, "ok", "boom", "1.0", 0, 1), "refused"),
    100: ((1, "ok", "", "1.0", 0, 1), "unique"),  # already in the table
    10: ((1, "fine", None, None, None, None), None),
}
POLICY = WritePolicy(on_bad_rows=BadRowPolicy.DEAD_LETTER)
GOOD = sorted(i for i, (_, reason) in ROWS.items() if reason is None)
BAD = {i: reason for i, (_, reason) in ROWS.items() if reason is not None}


def batches() -> list[pa.RecordBatch]:
    """The rows in two batches (bad rows in both)."""
    ids = list(ROWS)
    out = []
    for part in (ids[:5], ids[5:]):
        values = [ROWS[i][0] for i in part]
        out.append(
            pa.record_batch(
                {
                    "id": pa.array(part, pa.int64()),
                    "parent": pa.array([v[0] for v in values], pa.int64()),
                    "name": pa.array([v[1] for v in values], pa.string()),
                    "note": pa.array([v[2] for v in values], pa.string()),
                    "amount": pa.array(
                        [None if v[3] is None else Decimal(v[3]) for v in values],
                        pa.decimal128(6, 1),
                    ),
                    "at": pa.array(
                        [None if v[4] is None else v[4] for v in values],
                        pa.timestamp("us", "UTC"),
                    ),
                    "score": pa.array([v[5] for v in values], pa.int32()),
                }
            )
        )
    return out


class Job:
    def __init__(self, postgres: PostgresEndpoint, schema: str, job_id: str, store: Path) -> None:
        self.postgres = postgres
        self.schema = schema
        self.job_id = job_id
        self.store = store

    def sinks(self) -> tuple[PostgresSink, PostgresSink]:
        """The target and the dead-letter sink (its table created from the first dead
        letters)."""
        target = PostgresSink(
            Postgres(self.postgres.conninfo(), f"{self.schema}.events", name="events")
        )
        dead_letter = PostgresSink(
            Postgres(
                self.postgres.conninfo(),
                f"{self.schema}.events_dead_letters",
                name="dead_letters",
                create_table=True,
                participants_in_flight=4,
            )
        )
        return target, dead_letter

    def coordinator(
        self, cap: int = 20, *, one_phase: bool = True, executor_mode: bool = False
    ) -> Coordinator:
        target, dead_letter = self.sinks()
        coordinator = Coordinator(
            self.job_id,
            [target],
            LocalDirectoryStore(self.store),
            policy=POLICY,
            dead_letter=dead_letter,
            bad_row_cap=BadRowCap(cap),
            one_phase=one_phase,
            executor_mode=executor_mode,
        )
        coordinator.start()
        return coordinator


@pytest.fixture
def job(postgres: PostgresEndpoint, conn: Conn, pg_schema: str, job_id: str, tmp_path: Path) -> Job:
    def ident(name: str) -> sql.Identifier:
        return sql.Identifier(pg_schema, name)

    conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY)").format(ident("parents")))
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(ident("parents")))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {e} (id bigint PRIMARY KEY, parent bigint CONSTRAINT event_parent "
            "REFERENCES {p} (id), name varchar(5) NOT NULL, note text, amount numeric(4,1), "
            "at timestamptz, score int CONSTRAINT score_positive CHECK (score > 0))"
        ).format(e=ident("events"), p=ident("parents"))
    )
    conn.execute(
        sql.SQL(
            "CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.note = 'boom' THEN RAISE EXCEPTION 'no boom here'; END IF; "
            "RETURN NEW; END $$"
        ).format(f=ident("guard"))
    )
    conn.execute(
        sql.SQL(
            "CREATE TRIGGER guard BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}()"
        ).format(ident("events"), ident("guard"))
    )
    conn.execute(sql.SQL("INSERT INTO {} (id, name) VALUES (100, 'old')").format(ident("events")))
    return Job(postgres, pg_schema, job_id, tmp_path / "store")


def target_ids(conn: Conn, job: Job) -> list[int]:
    found = conn.execute(
        sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(job.schema, "events"))
    ).fetchall()
    return [r[0] for r in found]


def dead_letters(conn: Conn, job: Job) -> list[tuple[Any, ...]]:
    table = conn.execute(
        "SELECT to_regclass(%s)", (f"{job.schema}.events_dead_letters",)
    ).fetchone()
    if table is None or table[0] is None:
        return []
    return [
        tuple(r)
        for r in conn.execute(
            sql.SQL(
                "SELECT job_id, epoch, sink, part, row_number, reason, column_name, "
                "constraint_name, message, row_json FROM {} ORDER BY row_number"
            ).format(sql.Identifier(job.schema, "events_dead_letters"))
        ).fetchall()
    ]


def assert_each_row_in_one_place(
    conn: Conn, job: Job, parts: tuple[str, ...] = ("driver",)
) -> None:
    assert target_ids(conn, job) == [*GOOD, 100]
    letters = dead_letters(conn, job)
    by_id = {json.loads(letter[-1])["id"]: letter for letter in letters}
    assert len(by_id) == len(letters)  # nothing twice
    assert {i: letter[5] for i, letter in by_id.items()} == BAD
    assert {letter[:4] for letter in letters} == {(job.job_id, 0, "events", p) for p in parts}
    assert prepared_gids(conn, job.job_id, "events") == []
    assert prepared_gids(conn, job.job_id, "dead_letters") == []


def test_bad_rows_land_in_the_dead_letter_table_and_good_rows_in_the_target(
    job: Job, conn: Conn
) -> None:
    coordinator = job.coordinator()
    result = coordinator.run_epoch(0, batches())
    assert result.outcome is EpochOutcome.COMMITTED
    # One decision for both: the record names both participants.
    record = coordinator.decision(0)
    assert record is not None
    assert {h.sink for h in record.handles} == {"events", "dead_letters"}
    coordinator.close()
    assert_each_row_in_one_place(conn, job)
    letters = {json.loads(letter[-1])["id"]: letter for letter in dead_letters(conn, job)}
    # Where the server or the checks say it: the column, the constraint, the message.
    assert letters[2][6:8] == ("name", None)
    assert letters[7][7] == "event_parent"
    assert letters[8][7] == "score_positive"
    assert letters[100][7] == "events_pkey"
    assert "no boom here" in letters[9][8]
    assert json.loads(letters[3][-1])["name"] == "toolong"
    # A timestamp Python's datetime cannot hold is kept, as ISO 8601 with an expanded year.
    assert json.loads(letters[6][-1])["at"] == "-144169-06-28T09:59:32.612096+00:00"
    # The table was made from dead_letter_schema(), keyed on what names a dead letter.
    key = conn.execute(
        "SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_index i JOIN "
        "pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary",
        (f"{job.schema}.events_dead_letters",),
    ).fetchone()
    assert key is not None
    assert key[0] == ["job_id", "epoch", "sink", "part", "row_number"]


@pytest.mark.parametrize("one_phase", [True, False], ids=["one-phase", "two-phase"])
@pytest.mark.parametrize(
    "crash_at", ["after-pre-commit:events", "after-pre-commit:dead_letters", "after-decision"]
)
def test_a_crash_then_a_new_coordinator_leaves_each_row_in_exactly_one_place(
    crash_at: str, one_phase: bool, job: Job, conn: Conn
) -> None:
    first = job.coordinator(one_phase=one_phase)
    steps = first.epoch_steps(0, batches())
    assert crash_at in steps  # runs the generator up to that step
    steps.close()  # the driver dies there: nothing more of it runs
    first.close()
    if crash_at != "after-decision":  # (the decision may be the target's own commit)
        assert target_ids(conn, job) == [100]  # nothing visible before the decision

    second = job.coordinator(one_phase=one_phase)
    result = second.run_epoch(0, batches())
    assert result.outcome in (EpochOutcome.COMMITTED, EpochOutcome.ALREADY_COMMITTED)
    second.close()
    assert_each_row_in_one_place(conn, job)


def test_over_the_cap_nothing_is_visible_in_target_nor_dead_letter(job: Job, conn: Conn) -> None:
    coordinator = job.coordinator(cap=3)
    with pytest.raises(TooManyBadRowsError) as raised:
        coordinator.run_epoch(0, batches())
    assert "max_bad_rows=3" in raised.value.message
    assert coordinator.decision(0) is None
    coordinator.close()
    assert target_ids(conn, job) == [100]
    assert dead_letters(conn, job) == []
    assert prepared_gids(conn, job.job_id, "events") == []
    assert prepared_gids(conn, job.job_id, "dead_letters") == []


def test_executor_mode_workers_create_the_dead_letter_table_and_fill_it(
    job: Job, conn: Conn
) -> None:
    """Two parts, each written by a worker with its own sinks: the first worker with dead
    letters creates the table; each part's dead letters name their part."""
    coordinator = job.coordinator(one_phase=False, executor_mode=True)
    first, second = batches()

    def prepare(generation: int) -> list[CommitHandle]:
        assert dead_letters(conn, job) == []  # no table yet
        return [
            handle
            for part, batch in (("p0-t1", first), ("p1-t2", second))
            for handle in prepare_part(
                job.job_id,
                generation,
                0,
                part,
                job.sinks,
                [batch],
                policy=POLICY,
                dead_letter="dead_letters",
                bad_row_cap=BadRowCap(20),
            )
        ]

    result = coordinator.run_distributed_epoch(0, prepare)
    assert result.outcome is EpochOutcome.COMMITTED
    coordinator.close()
    assert_each_row_in_one_place(conn, job, parts=("p0-t1", "p1-t2"))


def test_dead_letters_replay_into_the_target_as_the_docs_show(job: Job, conn: Conn) -> None:
    """docs/dead-letters.md, "Replaying dead letters": once the cause is fixed, Postgres
    rebuilds the rows from row_json itself and moves them into the target."""
    coordinator = job.coordinator()
    coordinator.run_epoch(0, batches())
    coordinator.close()
    conn.execute(sql.SQL("INSERT INTO {} VALUES (9)").format(sql.Identifier(job.schema, "parents")))
    events = sql.Identifier(job.schema, "events")
    letters = sql.Identifier(job.schema, "events_dead_letters")
    with conn.transaction():
        conn.execute(
            sql.SQL(
                "INSERT INTO {e} SELECT (jsonb_populate_record(NULL::{e}, row_json::jsonb)).* "
                "FROM {d} WHERE job_id = %s AND sink = 'events' AND reason = 'foreign_key' "
                "AND epoch <= 0"
            ).format(e=events, d=letters),
            (job.job_id,),
        )
        conn.execute(
            sql.SQL(
                "DELETE FROM {d} WHERE job_id = %s AND sink = 'events' "
                "AND reason = 'foreign_key' AND epoch <= 0"
            ).format(d=letters),
            (job.job_id,),
        )
    assert target_ids(conn, job) == sorted([*GOOD, 7, 100])
    replayed = conn.execute(
        sql.SQL("SELECT parent, name, amount, at, score FROM {} WHERE id = 7").format(events)
    ).fetchone()
    assert replayed == (9, "ok", Decimal("1.0"), datetime(1970, 1, 1, tzinfo=UTC), 1)
    assert {letter[5] for letter in dead_letters(conn, job)} == set(BAD.values()) - {"foreign_key"}
