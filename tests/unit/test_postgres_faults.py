"""What a psycopg error becomes in the Postgres sink and decision store, without a server:
a lost session (the server ended it, restarted, or the network dropped it) is retriable and
names the server and the step, never the password; during a statement whose outcome it leaves
unknown it is InDoubtError; nothing psycopg raises leaves untranslated. And the sessions'
application_name."""

from __future__ import annotations

import psycopg
import pytest

from durable_sinks.clients.postgres import (
    connection_lost,
    server_of,
    session_name,
)
from durable_sinks.core import OpenContext
from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    FencedError,
    InDoubtError,
    ManifestError,
    SchemaMismatchError,
    TransientError,
)
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.sinks.postgres.errors import PostgresStep, psycopg_failure
from durable_sinks.sinks.postgres.fencing import application_name, owner_token

DSN = "host=db.example port=6543 dbname=orders user=etl password=s3cret"
CONTEXT = OpenContext("orders", "pg", 3, False)

#: Errors that mean the session is gone, as psycopg raises them.
LOST: list[psycopg.Error] = [
    psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
    psycopg.errors.CrashShutdown("terminating connection because of crash of another process"),
    psycopg.errors.CannotConnectNow("the database system is starting up"),
    psycopg.errors.IdleSessionTimeout("terminating connection due to idle-session timeout"),
    psycopg.errors.IdleInTransactionSessionTimeout(
        "terminating connection due to idle-in-transaction timeout"
    ),
    psycopg.errors.ConnectionFailure("connection failure"),
    psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly"),
    psycopg.OperationalError("the connection is closed"),
]
#: Operational errors on a live session: retriable, but the session is not lost.
BUSY: list[psycopg.Error] = [
    psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
    psycopg.errors.DeadlockDetected("deadlock detected"),
    psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
    psycopg.errors.SerializationFailure("could not serialize access"),
]
#: Refusals that are neither data, setup nor operational errors.
OTHER: list[psycopg.Error] = [
    psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"),
    psycopg.errors.DuplicateObject('transaction identifier "x" is already in use'),
    psycopg.InterfaceError("cursor already closed"),
]


def raise_in(step: PostgresStep, exc: Exception, *, fence_moved: bool = False) -> DurableSinkError:
    """What `exc`, raised in `step`, becomes (the sink raises it from `exc`)."""
    typed = psycopg_failure(exc, CONTEXT, step, lambda: fence_moved)
    assert typed is not None
    return typed


def ids(errors: list[psycopg.Error]) -> list[str]:
    return [type(e).__name__ for e in errors]


@pytest.mark.parametrize("exc", LOST, ids=ids(LOST))
def test_a_lost_session_is_recognised(exc: psycopg.Error) -> None:
    assert connection_lost(exc)


@pytest.mark.parametrize("exc", BUSY + OTHER, ids=ids(BUSY + OTHER))
def test_a_refusal_on_a_live_session_is_not_a_lost_one(exc: psycopg.Error) -> None:
    assert not connection_lost(exc)
    assert not connection_lost(ValueError("not a psycopg error"))


@pytest.mark.parametrize("exc", LOST, ids=ids(LOST))
def test_the_sink_turns_a_lost_session_into_a_transient_error_naming_server_and_step(
    exc: psycopg.Error,
) -> None:
    step = PostgresStep("write_batch (COPY)", 7, server=server_of(DSN), in_epoch=True)
    raised = raise_in(step, exc)
    assert type(raised) is TransientError
    assert raised.retriable
    text = str(raised)
    assert "db.example:6543/orders" in text
    assert "write_batch (COPY)" in text
    assert "nothing of the epoch was committed" in text
    assert "s3cret" not in text
    assert (raised.job, raised.sink, raised.epoch) == ("orders", "pg", 7)


@pytest.mark.parametrize("exc", LOST, ids=ids(LOST))
def test_a_lost_session_during_a_statement_of_unknown_outcome_is_in_doubt(
    exc: psycopg.Error,
) -> None:
    step = PostgresStep("pre_commit (PREPARE TRANSACTION g)", 7, "recovery", server_of(DSN))
    raised = raise_in(step, exc)
    assert type(raised) is InDoubtError
    assert raised.retriable
    assert raised.fix == "recovery"
    assert "unknown" in str(raised)


def test_a_lost_session_after_a_newer_generation_opened_is_fenced() -> None:
    step = PostgresStep("commit_with_decision (COMMIT)", 7, "replay", server_of(DSN))
    raised = raise_in(step, LOST[0], fence_moved=True)
    assert type(raised) is FencedError
    assert not raised.retriable


@pytest.mark.parametrize("exc", BUSY, ids=ids(BUSY))
def test_operational_errors_on_a_live_session_are_transient_even_where_outcomes_are_unknown(
    exc: psycopg.Error,
) -> None:
    # The server answered: the statement did not take effect, nothing is in doubt.
    for in_doubt in (None, "recovery"):
        raised = raise_in(PostgresStep("commit_with_decision (COMMIT)", 1, in_doubt, "h:1/d"), exc)
        assert type(raised) is TransientError
        assert exc.sqlstate is not None
        assert exc.sqlstate in str(raised)


@pytest.mark.parametrize("exc", OTHER, ids=ids(OTHER))
def test_any_other_refusal_is_a_typed_error_that_is_not_retried(exc: psycopg.Error) -> None:
    raised = raise_in(PostgresStep("open", server="h:1/d"), exc)
    assert type(raised) is DurableSinkError
    assert not raised.retriable
    assert "h:1/d refused open" in str(raised)


def test_data_and_setup_errors_keep_their_translation() -> None:
    step = PostgresStep("write_batch (COPY)", 1, server="h:1/d", in_epoch=True)
    assert type(raise_in(step, psycopg.errors.NotNullViolation("null"))) is SchemaMismatchError
    assert type(raise_in(step, psycopg.errors.UndefinedTable("no table"))) is ConfigError


@pytest.mark.parametrize(
    ("dsn", "server"),
    [
        (DSN, "db.example:6543/orders"),
        ("postgresql://etl:s3cret@db.example/orders", "db.example:5432/orders"),
        ("host=db.example user=etl password=s3cret", "db.example:5432/etl"),
        ("hostaddr=10.0.0.5 port=5433 dbname=x", "10.0.0.5:5433/x"),
        # a primary and its standby: each server with its port
        (
            "host=p.example,s.example port=5432,5433 password=s3cret "
            "target_session_attrs=read-write dbname=x",
            "p.example:5432,s.example:5433/x",
        ),
        ("host=p.example,s.example port=6000 dbname=x", "p.example:6000,s.example:6000/x"),
        (
            "postgresql://etl:s3cret@p.example:5432,s.example:5433/x",
            "p.example:5432,s.example:5433/x",
        ),
    ],
)
def test_server_of_names_host_port_and_database_never_credentials(
    dsn: str, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("PGHOST", "PGPORT", "PGDATABASE", "PGUSER"):
        monkeypatch.delenv(variable, raising=False)
    assert server_of(dsn) == server


def test_sink_sessions_are_named_after_job_sink_and_generation() -> None:
    name = application_name(CONTEXT, 3)
    assert name == f"ds:orders:pg:{owner_token(CONTEXT)}:g3"
    assert application_name(CONTEXT, 3, DSN) == name


def test_a_long_job_id_is_cut_but_owner_and_generation_survive() -> None:
    context = OpenContext("j" * 80 + "é", "sink-with-a-long-name", 123456, False)
    name = application_name(context, 123456)
    assert len(name.encode()) == 63
    assert name.startswith("ds:jjjj")
    assert name.endswith(f":{owner_token(context)}:g123456")
    assert name.isascii()


def test_the_dsns_application_name_replaces_the_readable_part_only() -> None:
    name = application_name(CONTEXT, 3, DSN + " application_name=billing")
    assert name == f"billing:{owner_token(CONTEXT)}:g3"


def test_session_name_keeps_what_postgres_keeps() -> None:
    assert session_name("ds:ordérs:store") == "ds:ord?rs:store"
    assert session_name("x" * 100) == "x" * 63
    assert session_name("x" * 100, ":tail") == "x" * 58 + ":tail"


@pytest.mark.parametrize("exc", LOST, ids=ids(LOST))
def test_the_store_turns_a_lost_session_into_a_transient_error(exc: psycopg.Error) -> None:
    store = PostgresDecisionStore(DSN)
    with pytest.raises(TransientError) as raised, store._errors("expire (old decisions)", 4):
        raise exc
    text = str(raised.value)
    assert "db.example:6543/orders" in text
    assert "expire (old decisions)" in text
    assert "s3cret" not in text
    assert raised.value.fix is not None


def test_the_store_reports_other_refusals_as_manifest_errors() -> None:
    store = PostgresDecisionStore(DSN)
    with pytest.raises(TransientError), store._errors("get (the decision)"):
        raise BUSY[0]
    for exc in OTHER:
        with pytest.raises(ManifestError), store._errors("get (the decision)"):
            raise exc


def test_closing_what_never_connected_does_not_raise() -> None:
    PostgresDecisionStore(DSN).close()
