"""The Postgres primary and streaming standby (`postgres-standby`): the pair comes up with the
standby streaming in the mode asked for; a synchronous standby keeps a prepared transaction
across a failover, where it commits; an asynchronous standby whose WAL stream was held back
loses what the primary acknowledged meanwhile (which is why docs/postgres.md asks for a
synchronous standby), which the old primary, started alone, still holds; the old primary
stays down and `up` does not start it again.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.services import PostgresPair, Testbed, up

pytestmark = pytest.mark.replicated_tier


def _prepare(conninfo: str, gid: str, value: int) -> None:
    with psycopg.connect(conninfo) as conn:
        conn.execute("INSERT INTO facts VALUES (%s)", (value,))
        conn.execute(f"PREPARE TRANSACTION '{gid}'")


def _make_table(pair: PostgresPair) -> None:
    with psycopg.connect(pair.endpoint().conninfo(), autocommit=True) as conn:
        conn.execute("CREATE TABLE facts (x int)")


def _facts(conninfo: str) -> list[int]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return [row[0] for row in conn.execute("SELECT x FROM facts ORDER BY x").fetchall()]


def _gids(conninfo: str) -> list[str]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return [row[0] for row in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()]


def test_the_pair_comes_up_streaming_in_either_mode(postgres_standby: PostgresPair) -> None:
    for mode in ("async", "sync"):
        postgres_standby.reset(mode)
        with psycopg.connect(postgres_standby.primary_endpoint().conninfo()) as conn:
            row = conn.execute(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'"
            ).fetchone()
        assert row == (mode,), mode
        with psycopg.connect(postgres_standby.standby_endpoint().conninfo()) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        # the pair's connection string reaches the primary, whichever server it names first
        with psycopg.connect(postgres_standby.endpoint().conninfo()) as conn:
            assert conn.info.port == postgres_standby.primary.port
    status = postgres_standby.status()
    assert status.running
    assert "sync: primary 127.0.0.1:" in status.detail
    assert "password" not in status.detail


def test_a_synchronous_standby_keeps_a_prepared_transaction_across_a_failover(
    postgres_standby: PostgresPair, testbed: Testbed
) -> None:
    pair = postgres_standby
    pair.reset("sync")
    _make_table(pair)
    old_primary = pair.primary
    _prepare(pair.endpoint().conninfo(), "kept", 1)
    assert _gids(pair.standby_endpoint().conninfo()) == []  # a hot standby lists none

    seconds = pair.fail_over()
    print(f"fail over to the synchronous standby: {seconds:.2f} s until it accepts writes")
    assert seconds < 10
    assert old_primary.postmaster_pid() is None
    conninfo = pair.endpoint().conninfo()
    assert _gids(conninfo) == ["kept"]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        assert conn.info.port == pair.primary.port != old_primary.port
        conn.execute("COMMIT PREPARED 'kept'")  # returns: no synchronous standby is waited for
    assert _facts(conninfo) == [1]

    up([pair.name], testbed)  # the old primary stays down: no split brain
    assert old_primary.postmaster_pid() is None
    assert "retired" in pair.status().detail
    pair.rebuild_standby()  # and the pair can have a standby again, streaming synchronously
    _prepare(conninfo, "again", 2)
    assert pair.fail_over() < 10
    assert _gids(pair.endpoint().conninfo()) == ["again"]


def test_an_asynchronous_standby_held_back_loses_what_the_primary_acknowledged(
    postgres_standby: PostgresPair,
) -> None:
    pair = postgres_standby
    pair.reset("async")
    _make_table(pair)
    conninfo = pair.endpoint().conninfo()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("INSERT INTO facts VALUES (1)")
    with pair.hold_wal():
        _prepare(conninfo, "lost", 2)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("INSERT INTO facts VALUES (3)")
        pair.fail_over()
    # Row 1 had reached the standby before the hold (hold_wal waits until it streamed);
    # the PREPARE and row 3, acknowledged by the old primary, are gone without an error.
    assert _gids(conninfo) == []
    assert _facts(conninfo) == [1]
    # The old primary, started alone outside the pair's connection string, still has them:
    # what a repair copies from.
    with pair.retired_alone() as old:
        assert old.port not in {port for _, port in pair.endpoint().servers}
        assert _gids(old.conninfo()) == ["lost"]
        assert _facts(old.conninfo()) == [1, 3]
    assert pair.server("a" if pair.primary.slot == "b" else "b").postmaster_pid() is None


def test_holding_the_wal_of_a_synchronous_pair_is_refused(postgres_standby: PostgresPair) -> None:
    postgres_standby.reset("sync")
    held = postgres_standby.hold_wal()
    with pytest.raises(Exception, match=r"hold_wal\(\) needs an async pair"), held:
        pass
