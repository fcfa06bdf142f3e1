"""TLS, authentication and least privilege against the test bed's secured servers: Postgres
with `sslmode=verify-full`, Kafka's SASL_SSL listener (SCRAM-SHA-512, ACLs enforced).

A whole job runs with exactly the privileges docs/security.md lists, crashes after its
decision and recovers; every refusal (a wrong CA, a wrong host name, a bad, expired or revoked
credential, each missing ACL or GRANT) stops the job at start with a ConfigError that names
the problem and the fix, fast, and with nothing written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql

from durable_sinks.cli import main
from durable_sinks.clients.s3 import S3Connection, S3Location
from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.core.errors import ConfigError
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.manifest.s3 import S3DecisionStore
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from durable_sinks.sinks.s3 import S3Sink
from durable_sinks.sinks.s3.reader import committed_dataset
from durable_sinks.testing import run_conformance
from tests.conftest import UniqueNames
from tests.crash.test_file_sink_conformance import check_exercised
from tests.integration.test_postgres_conformance import scenario_of
from tests.services import PostgresEndpoint, S3Endpoint, Testbed
from tests.services.tls import WRONG_NAME
from tests.support.kafka_access import KafkaAccess, ScramUser, job_acls
from tests.support.pg_access import prepared_of
from tests.support.s3_access import S3Access
from tests.support.s3_target import s3_options, s3_sink_config
from tests.support.targets import prepared_gids
from tests.support.tiers import CONFORMANCE_SAMPLE

#: A refusal must come at once, not after a connection time-out (20 s here).
FAST_S = 8.0
REQUEST_TIMEOUT_S = 20


def rows(first: int, count: int) -> pa.RecordBatch:
    ids = list(range(first, first + count))
    return pa.record_batch({"id": pa.array(ids, pa.int64()), "note": [f"n{i}" for i in ids]})


def end_offsets(admin_config: dict[str, Any], topics: list[str]) -> dict[str, int]:
    consumer = Consumer({**admin_config, "group.id": "security-test-reader"})
    try:
        return {
            t: consumer.get_watermark_offsets(TopicPartition(t, 0), timeout=10)[1] for t in topics
        }
    finally:
        consumer.close()


def committed_records(admin_config: dict[str, Any], topic: str) -> int:
    """Records a read_committed reader sees in the topic's only partition."""
    consumer = Consumer(
        {
            **admin_config,
            "group.id": "security-test-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen, deadline = 0, time.monotonic() + 15
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                if (
                    seen
                    and consumer.position([TopicPartition(topic, 0)])[0].offset
                    >= end_offsets(admin_config, [topic])[topic]
                ):
                    break
                continue
            if message.error() is None:
                seen += 1
        return seen
    finally:
        consumer.close()


def kafka_sink(
    kafka_access: KafkaAccess, user: ScramUser, topic: str, **security: Any
) -> KafkaSink:
    host = security.pop("host", None)
    endpoint = kafka_access.endpoint(user, host=host)
    settings = {**endpoint.security, **security}
    return KafkaSink(
        Kafka(
            endpoint.bootstrap_servers,
            topic,
            request_timeout_s=REQUEST_TIMEOUT_S,
            producer_config=settings,
        )
    )


def refused_at_start(coordinator: Coordinator, words: str, fix_words: str, secret: str) -> None:
    """`start` raises a ConfigError (not retriable) at once, holding `words`, with a fix
    holding `fix_words`, and never `secret`."""
    started = time.monotonic()
    try:
        with pytest.raises(ConfigError) as refused:
            coordinator.start()
    finally:
        coordinator.close()
    took = time.monotonic() - started
    error = refused.value
    assert words in str(error), str(error)
    assert fix_words in (error.fix or ""), error.fix
    assert took < FAST_S, f"refused after {took:.1f} s"
    assert secret not in str(error)
    assert secret not in repr(error)


def crash_after_decision_then_recover(coordinator: Callable[[], Coordinator]) -> None:
    """Epoch 0 (5 rows) commits; the driver dies right after epoch 1's decision (7 rows:
    decided, not finished); a new coordinator finishes it at start, recognises Spark's
    replay of it, and commits epoch 2 (3 rows): 15 rows in all, each once."""
    first = coordinator()
    first.start()
    assert first.run_epoch(0, [rows(0, 5)]).outcome is EpochOutcome.COMMITTED
    steps = first.epoch_steps(1, [rows(5, 7)])
    while next(steps) != "after-decision":
        pass
    second = coordinator()
    try:
        second.start()
        assert second.run_epoch(1, [rows(5, 7)]).outcome is EpochOutcome.ALREADY_COMMITTED
        assert second.run_epoch(2, [rows(12, 3)]).outcome is EpochOutcome.COMMITTED
    finally:
        second.close()
        first.close()


# -- Kafka ----------------------------------------------------------------------------------------


def test_kafka_job_with_exactly_the_documented_acls_crashes_and_recovers(
    kafka_access: KafkaAccess, secure_topic: str, unique: UniqueNames, tmp_path: Path
) -> None:
    """SASL_SSL, SCRAM, ACLs: the topic, the progress topic, the progress reader's group and
    the `ds:<job>:` transactional ids; nothing on the cluster. An epoch decided and then
    abandoned (the driver died) is finished by the next start."""
    user = kafka_access.user()
    kafka_access.allow(*job_acls(user.name, unique.job_id, secure_topic).values())
    store = tmp_path / "store"
    crash_after_decision_then_recover(
        lambda: Coordinator(
            unique.job_id,
            [kafka_sink(kafka_access, user, secure_topic)],
            LocalDirectoryStore(store),
        )
    )
    admin = kafka_access.testbed.kafka.endpoint().config()
    assert committed_records(admin, secure_topic) == 5 + 7 + 3


#: What is wrong: (how to set it up, words the error must hold, words of its fix).
Refusals = dict[str, tuple[dict[str, Any], str, str]]
KAFKA_REFUSALS: Refusals = {
    # what is wrong: (how to set it up, the words the error must hold, the fix's words)
    "bad password": (
        {"sasl.password": "not-the-password"},
        "refused the SASL login",
        "sasl.password",
    ),
    "wrong CA": ({"ca": "other"}, "unable to get local issuer certificate", "ssl.ca.location"),
    "wrong host name": ({"host": WRONG_NAME}, "not valid for '127.0.0.1'", "host name"),
    "revoked user": ({"revoke": True}, "refused the SASL login", "deleted"),
    "no WRITE on the topic": ({"leave": "topic write"}, "may not WRITE topic", "grant"),
    "no ACL on the topic": ({"leave": "topic"}, "may not see it", "DESCRIBE on it"),
    "no ACL on the progress topic": (
        {"leave": "progress topic"},
        "refuses to create progress topic",
        "DESCRIBE",
    ),
    "no ACL on the transactional ids": (
        {"leave": "transactional id"},
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        "prefixed",
    ),
    "no ACL on the progress reader's group": (
        {"leave": "progress reader group"},
        "GROUP_AUTHORIZATION_FAILED",
        "durable-sinks-progress-reader",
    ),
}


@pytest.mark.parametrize("case", sorted(KAFKA_REFUSALS))
def test_kafka_refusals_stop_the_job_at_start_with_the_fix(
    case: str,
    kafka_access: KafkaAccess,
    secure_topic: str,
    unique: UniqueNames,
    testbed: Testbed,
    tmp_path: Path,
) -> None:
    setup, words, fix_words = KAFKA_REFUSALS[case]
    user = kafka_access.user()
    acls = job_acls(user.name, unique.job_id, secure_topic)
    left_out = {setup.get("leave")} | ({"topic write"} if setup.get("leave") == "topic" else set())
    kafka_access.allow(*(group for purpose, group in acls.items() if purpose not in left_out))
    security: dict[str, Any] = {k: v for k, v in setup.items() if k.startswith("sasl.")}
    if setup.get("ca") == "other":
        tls = testbed.kafka.layout.service_dir("tls")
        security["ssl.ca.location"] = str(tls / "other-ca.pem")
    if "host" in setup:
        security["host"] = setup["host"]
    if setup.get("revoke"):
        kafka_access.revoke(user)
    sink = kafka_sink(kafka_access, user, secure_topic, **security)
    refused_at_start(
        Coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path / "store")),
        words,
        fix_words,
        user.password,
    )
    admin = testbed.kafka.endpoint().config()
    written = end_offsets(admin, [secure_topic, f"{secure_topic}-ds-progress"])
    assert written == {secure_topic: 0, f"{secure_topic}-ds-progress": 0}, "something was written"


# -- Postgres -------------------------------------------------------------------------------------


def table_rows(postgres: PostgresEndpoint, table: str) -> int:
    with psycopg.connect(postgres.conninfo()) as conn:
        found = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(*table.split(".")))
        ).fetchone()
    assert found is not None
    return int(found[0])


def schema_tables(postgres: PostgresEndpoint, schema: str) -> set[str]:
    with psycopg.connect(postgres.conninfo()) as conn:
        found = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
        ).fetchall()
    return {row[0] for row in found}


def test_postgres_job_over_verify_full_with_exactly_the_documented_grants(
    postgres: PostgresEndpoint, pg_schema: str, events_table: str, roles: Any, unique: UniqueNames
) -> None:
    """The sink and the Postgres decision store over `sslmode=verify-full` as a role with
    USAGE and CREATE on the schema and SELECT, INSERT on the table; two-phase (a second
    sink would force it; here one_phase=False): crash after the decision, recover."""
    role = roles()
    role.grant_table("events")

    def coordinator() -> Coordinator:
        sink = PostgresSink(Postgres(role.dsn(), events_table))
        store = PostgresDecisionStore(role.dsn(), schema=pg_schema)
        return Coordinator(unique.job_id, [sink], store, one_phase=False)

    crash_after_decision_then_recover(coordinator)
    with psycopg.connect(postgres.conninfo()) as conn:
        plain = conn.execute(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
            "WHERE a.usename = %s AND NOT s.ssl",
            (role.name,),
        ).fetchone()
    assert plain == (0,), "a session of the job's role without TLS"
    assert table_rows(postgres, events_table) == 15
    with psycopg.connect(postgres.conninfo()) as conn:
        assert prepared_gids(conn, unique.job_id, "postgres") == []


PG_REFUSALS: Refusals = {
    "wrong CA": ({"sslrootcert": "other"}, "certificate verify failed", "sslrootcert"),
    "wrong host name": ({"host": WRONG_NAME}, "does not match host name", "host name"),
    "bad password": (
        {"password": "not-the-password"},
        "password authentication failed",
        "password",
    ),
    "expired password": ({"expire": True}, "password authentication failed", "VALID UNTIL"),
    "no CREATE on the schema": (
        {"create": False},
        "cannot create the marker/fence tables",
        "GRANT CREATE ON SCHEMA",
    ),
    "no INSERT on the table": ({"grant": "SELECT"}, "lacks INSERT", "GRANT INSERT"),
}


@pytest.mark.parametrize("case", sorted(PG_REFUSALS))
def test_postgres_refusals_stop_the_job_at_start_with_the_fix(
    case: str,
    postgres: PostgresEndpoint,
    pg_schema: str,
    events_table: str,
    roles: Any,
    unique: UniqueNames,
    tmp_path: Path,
) -> None:
    setup, words, fix_words = PG_REFUSALS[case]
    role = roles(create=setup.get("create", True))
    role.grant_table("events", setup.get("grant", "SELECT, INSERT"))
    if setup.get("expire"):
        role.expire()
    extra = {k: v for k, v in setup.items() if k in ("host", "password")}
    if setup.get("sslrootcert") == "other":
        assert postgres.tls is not None
        extra["sslrootcert"] = str(postgres.tls.other_ca)
    before = schema_tables(postgres, pg_schema)
    sink = PostgresSink(Postgres(role.dsn(**extra), events_table))
    refused_at_start(
        Coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path / "store")),
        words,
        fix_words,
        role.password,
    )
    assert schema_tables(postgres, pg_schema) == before, "something was created"
    assert table_rows(postgres, events_table) == 0


def test_postgres_prepared_transactions_of_another_role_are_refused_at_start(
    postgres: PostgresEndpoint, pg_schema: str, events_table: str, roles: Any, unique: UniqueNames
) -> None:
    """Only the role that prepared a transaction (or a superuser) may finish it: a job
    restarted under another role is refused before it writes, naming the owner."""
    owner, other = roles(), roles()
    owner.grant_table("events")
    other.grant_table("events")
    first = Coordinator(
        unique.job_id,
        [PostgresSink(Postgres(owner.dsn(), events_table))],
        PostgresDecisionStore(owner.dsn(), schema=pg_schema),
        one_phase=False,
    )
    first.start()
    steps = first.epoch_steps(0, [rows(0, 3)])
    while next(steps) != "after-decision":
        pass
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA {} TO {}").format(
                sql.Identifier(pg_schema), sql.Identifier(other.name)
            )
        )
        held = prepared_of(conn, owner.name)
    assert held, "the decided epoch left no prepared transaction to refuse"
    first.close()  # the first driver is gone: its sessions end, its prepared transaction stays
    second = Coordinator(
        unique.job_id,
        [PostgresSink(Postgres(other.dsn(), events_table))],
        PostgresDecisionStore(other.dsn(), schema=pg_schema),
        one_phase=False,
    )
    try:
        with pytest.raises(ConfigError, match="belong to role") as refused:
            second.start()
        assert owner.name in (refused.value.fix or "")
        with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
            assert prepared_of(conn, owner.name) == held
        second.close()
        third = Coordinator(
            unique.job_id,
            [PostgresSink(Postgres(owner.dsn(), events_table))],
            PostgresDecisionStore(owner.dsn(), schema=pg_schema),
            one_phase=False,
        )
        try:
            third.start()  # its own role finishes the decided epoch
        finally:
            third.close()
    finally:
        second.close()
        first.close()
    assert table_rows(postgres, events_table) == 3


# -- S3 over HTTPS ---------------------------------------------------------------------------------


def s3_connection(endpoint: S3Endpoint) -> S3Connection:
    options = s3_options(endpoint, "s3://unused/x")
    del options["path"]
    return S3Connection(**options)


def test_s3_job_over_https_with_the_s3_decision_store_crashes_and_recovers(
    s3_https: S3Endpoint, unique: UniqueNames
) -> None:
    """The sink and its decision store over HTTPS, verified against the test bed's CA."""
    s3_job_crashes_and_recovers(s3_https, f"s3://{s3_https.bucket}/{unique.name('tls')}", unique)


def s3_job_crashes_and_recovers(endpoint: S3Endpoint, path: str, unique: UniqueNames) -> None:
    """An S3 sink at `path` with the S3 decision store beside it, both through `endpoint`,
    through `crash_after_decision_then_recover`; its readers see the 15 rows once each."""
    connection = s3_connection(endpoint)

    def coordinator() -> Coordinator:
        store = S3DecisionStore(S3Location.parse(path).child("_decisions"), connection)
        return Coordinator(unique.job_id, [S3Sink(s3_sink_config(endpoint, path))], store)

    crash_after_decision_then_recover(coordinator)
    table = committed_dataset(path, connection).to_table()
    assert sorted(table.column("id").to_pylist()) == list(range(15))


S3_REFUSALS: Refusals = {
    "wrong CA": ({"ca_bundle": "other"}, "unable to get local issuer certificate", "ca_bundle"),
    "no CA given (the system's)": ({"ca_bundle": None}, "certificate verify failed", "ca_bundle"),
    "wrong host name": ({"host": WRONG_NAME}, "doesn't match", "host name"),
}


@pytest.mark.parametrize("case", sorted(S3_REFUSALS))
def test_s3_refusals_stop_the_job_at_start_with_the_fix(
    case: str, s3_https: S3Endpoint, testbed: Testbed, unique: UniqueNames, tmp_path: Path
) -> None:
    setup, words, fix_words = S3_REFUSALS[case]
    endpoint = testbed.s3.https_endpoint(host=setup.get("host", "localhost"))
    options: dict[str, Any] = {}
    if "ca_bundle" in setup:
        other = testbed.s3.layout.service_dir("tls") / "other-ca.pem"
        options["ca_bundle"] = str(other) if setup["ca_bundle"] == "other" else None
    path = f"s3://{s3_https.bucket}/{unique.name('tls')}"
    sink = S3Sink(s3_sink_config(endpoint, path, **options))
    refused_at_start(
        Coordinator(unique.job_id, [sink], LocalDirectoryStore(tmp_path / "store")),
        words,
        fix_words,
        s3_https.secret_access_key,
    )
    listed = (
        testbed.s3.endpoint()
        .client()
        .list_objects_v2(Bucket=s3_https.bucket, Prefix=path.split("/", 3)[3])
    )
    assert listed.get("KeyCount", 0) == 0, "something was written"


def test_the_postgres_conformance_suite_over_tls_short_form(
    postgres: PostgresEndpoint, pg_schema: str
) -> None:
    """The crash/replay suite (its scripted sweep and 20 generated examples) with the sink
    and the Postgres decision store over `sslmode=verify-full`, two-phase."""
    secured = postgres.over_tls()
    assert "sslmode='verify-full'" in secured.conninfo()
    stats = run_conformance(
        scenario_of(secured, pg_schema, store="postgres", one_phase=False),
        max_examples=CONFORMANCE_SAMPLE,
    )
    check_exercised(stats)


def test_doctor_names_the_missing_grant_and_acl(
    postgres: PostgresEndpoint,
    events_table: str,
    roles: Any,
    kafka_access: KafkaAccess,
    secure_topic: str,
    unique: UniqueNames,
    tmp_path: Path,
) -> None:
    """`durable-sinks doctor` runs the start's checks: a role without INSERT and a Kafka user
    without the transactional-id ACL each fail it with the GRANT or ACL to add."""
    role = roles()
    role.grant_table("events", "SELECT")
    user = kafka_access.user()
    acls = job_acls(user.name, unique.job_id, secure_topic)
    kafka_access.allow(*(group for purpose, group in acls.items() if purpose != "transactional id"))
    endpoint = kafka_access.endpoint(user)
    for sink_settings, words in (
        ({"kind": "postgres", "dsn": role.dsn(), "table": events_table}, "GRANT INSERT"),
        (
            {
                "kind": "kafka",
                "bootstrap_servers": endpoint.bootstrap_servers,
                "topic": secure_topic,
                "producer_config": dict(endpoint.security),
            },
            "--resource-pattern-type prefixed",
        ),
    ):
        job_file = tmp_path / f"{sink_settings['kind']}.json"
        job_file.write_text(
            json.dumps(
                {
                    "job_id": unique.job_id,
                    "decision_store": str(tmp_path / "store"),
                    "sinks": [sink_settings],
                }
            )
        )
        result = CliRunner().invoke(main, ["doctor", unique.job_id, "-f", str(job_file)])
        assert result.exit_code != 0, result.output
        assert words in " ".join(result.output.split()), result.output
        assert role.password not in result.output
        assert user.password not in result.output


#: docs/security.md's S3 actions for the job (GetLifecycleConfiguration is optional: left out).
S3_JOB_ACTIONS = (
    "s3:ListBucket",
    "s3:ListBucketMultipartUploads",
    "s3:GetObject",
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:AbortMultipartUpload",
)


def test_s3_job_with_exactly_the_documented_actions_crashes_and_recovers(
    s3_access: S3Access, unique: UniqueNames
) -> None:
    """On moto, which evaluates S3's fine-grained actions: credentials allowed only the
    documented actions on the bucket run a job with the S3 decision store through a crash
    after its decision."""
    limited = s3_access.endpoint("moto", allow=S3_JOB_ACTIONS)
    s3_job_crashes_and_recovers(limited, f"s3://{limited.bucket}/{unique.name('least')}", unique)
