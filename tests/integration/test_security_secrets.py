"""No secret anywhere: a job into Postgres (TLS, a role's password in the DSN), Kafka
(SASL_SSL, the SCRAM password from `${env:...}`) and S3 (HTTPS, the secret key from
`${file:...}`), with the Postgres decision store, crashes after a decision and recovers, refuses
a bad batch and a bad certificate; then every log line, error, repr, decision record, marker
row, progress record, manifest, metric and `durable-sinks` output it produced is scanned for
each secret."""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql

from durable_sinks.cli import main
from durable_sinks.coordinator import Coordinator
from durable_sinks.core.errors import DurableSinkError
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.sinks.kafka import Kafka, KafkaSink
from durable_sinks.sinks.postgres import Postgres, PostgresSink
from durable_sinks.sinks.s3 import S3Sink
from durable_sinks.spark._observe import BatchObserver
from tests.conftest import UniqueNames
from tests.integration.test_security import rows
from tests.services import PostgresEndpoint, S3Endpoint, Testbed
from tests.support.kafka_access import KafkaAccess, job_acls, operator_acls
from tests.support.s3_target import s3_options, s3_sink_config


def progress_records(testbed: Testbed, topic: str) -> list[str]:
    consumer = Consumer(
        {
            **testbed.kafka.endpoint().config(),
            "group.id": "secrets-scan",
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen: list[str] = []
        while True:
            message = consumer.poll(5)
            if message is None or message.error() is not None:
                return seen
            seen.append(repr((message.key(), message.value(), message.headers())))
    finally:
        consumer.close()


def scraped_metrics(
    job: str, results: list[Any], error: BaseException, coordinator: Coordinator
) -> str:
    """What the job's Prometheus endpoint serves after these epochs (and a failed one), as
    the Spark writer feeds it (spark/_observe.py), plus the per-epoch log records."""
    observer = BatchObserver(job, "driver")
    observer.serve(0)
    observer.started(None)
    for result in [*results, None]:
        observer.batch(
            result.epoch if result is not None else 3,
            result,
            seconds=0.1,
            attempts=1,
            failed_attempts=0 if result is not None else 1,
            generation=2,
            current=coordinator.totals,
            recovery=None,
            error=None if result is not None else error,
        )
    assert observer.metrics is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{observer.metrics.port}/metrics") as page:
        text = str(page.read().decode())
    assert "durable_sinks_" in text, text[:300]
    return text


def test_no_secret_in_anything_a_crash_and_recover_run_over_tls_produces(
    postgres: PostgresEndpoint,
    pg_schema: str,
    events_table: str,
    roles: Any,
    kafka_access: KafkaAccess,
    secure_topic: str,
    s3_https: S3Endpoint,
    testbed: Testbed,
    unique: UniqueNames,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    role = roles()
    role.grant_table("events")
    user = kafka_access.user()
    kafka_access.allow(*job_acls(user.name, unique.job_id, secure_topic).values())
    monkeypatch.setenv("DS_SCAN_KAFKA_PASSWORD", user.password)
    s3_secret_file = tmp_path / "s3-secret"
    s3_secret_file.write_text(s3_https.secret_access_key + "\n")
    secrets = {
        "postgres password": role.password,
        "kafka password": user.password,
        "s3 secret key": s3_https.secret_access_key,
    }
    kafka_security = {
        **kafka_access.endpoint(user).security,
        "sasl.password": "${env:DS_SCAN_KAFKA_PASSWORD}",
    }
    kafka_endpoint = kafka_access.endpoint(user)
    s3_path = f"s3://{s3_https.bucket}/{unique.name('scan')}"
    s3_settings = s3_options(s3_https, s3_path, secret_access_key=f"${{file:{s3_secret_file}}}")

    def parts() -> tuple[list[Any], PostgresDecisionStore]:
        sinks = [
            PostgresSink(Postgres(role.dsn(), events_table)),
            S3Sink(
                s3_sink_config(
                    s3_https, s3_path, secret_access_key=s3_settings["secret_access_key"]
                )
            ),
            KafkaSink(
                Kafka(
                    kafka_endpoint.bootstrap_servers,
                    secure_topic,
                    request_timeout_s=20,
                    producer_config=kafka_security,
                )
            ),
        ]
        return sinks, PostgresDecisionStore(role.dsn(), schema=pg_schema)

    texts: list[str] = []
    errors: list[BaseException] = []
    first_sinks, first_store = parts()
    first = Coordinator(unique.job_id, first_sinks, first_store)
    first.start()
    results = [first.run_epoch(0, [rows(0, 5)])]
    steps = first.epoch_steps(1, [rows(5, 4)])
    while next(steps) != "after-decision":
        pass  # the driver dies: epoch 1 decided, nothing finished
    sinks, store = parts()
    second = Coordinator(unique.job_id, sinks, store)
    try:
        second.start()
        results.append(second.run_epoch(1, [rows(5, 4)]))
        results.append(second.run_epoch(2, [rows(9, 3)]))
        with pytest.raises(DurableSinkError) as bad_batch:
            second.run_epoch(3, [pa.record_batch({"id": [None], "note": ["x"]})])
        errors.append(bad_batch.value)
        texts += [repr(o) for o in (*sinks, store, second, *results)]
        texts += [repr(sink.config) for sink in sinks]
        texts += [str(r.decision.to_json()) for r in results]
        texts += [str(r.metrics) for r in results]
        texts += [str(sink.metrics()) for sink in sinks]
        texts += [str(second.totals)]
        texts.append(scraped_metrics(unique.job_id, results, bad_batch.value, second))
        texts += [str(second.decision(epoch)) for epoch in range(3)]
    finally:
        second.close()
        first.close()

    other_ca = str(testbed.kafka.layout.service_dir("tls") / "other-ca.pem")
    refused = Coordinator(
        unique.job_id,
        [
            KafkaSink(
                Kafka(
                    kafka_endpoint.bootstrap_servers,
                    secure_topic,
                    request_timeout_s=20,
                    producer_config={**kafka_security, "ssl.ca.location": other_ca},
                )
            )
        ],
        PostgresDecisionStore(role.dsn(), schema=pg_schema),
    )
    with pytest.raises(DurableSinkError) as bad_certificate:
        refused.start()
    refused.close()
    errors.append(bad_certificate.value)
    for error in errors:
        texts += [str(error), repr(error), str(error.__dict__)]

    with psycopg.connect(postgres.conninfo()) as conn:
        for table in ("durable_sinks_epochs", "durable_sinks_fences", "durable_sinks_decisions"):
            found = conn.execute(
                sql.SQL("SELECT * FROM {}").format(sql.Identifier(pg_schema, table))
            )
            texts += [repr(row) for row in found.fetchall()]
    texts += progress_records(testbed, f"{secure_topic}-ds-progress")
    client = testbed.s3.endpoint().client()
    prefix = s3_path.split("/", 3)[3]
    for item in client.list_objects_v2(Bucket=s3_https.bucket, Prefix=prefix).get("Contents", []):
        if not item["Key"].endswith(".parquet"):
            texts.append(
                client.get_object(Bucket=s3_https.bucket, Key=item["Key"])["Body"].read().decode()
            )

    job_file = tmp_path / "job.json"
    job_file.write_text(
        json.dumps(
            {
                "job_id": unique.job_id,
                "sinks": [
                    {"kind": "postgres", "dsn": "${env:SCAN_PG_DSN}", "table": events_table},
                    {**s3_settings, "kind": "s3", "name": "s3"},
                    {
                        "kind": "kafka",
                        "bootstrap_servers": kafka_endpoint.bootstrap_servers,
                        "topic": secure_topic,
                        "producer_config": kafka_security,
                    },
                ],
            }
        )
    )
    env = {"SCAN_PG_DSN": role.dsn(), "DS_SCAN_KAFKA_PASSWORD": user.password}
    kafka_access.allow(operator_acls(user.name, secure_topic))
    for command in ("status", "inspect", "verify", "doctor"):
        result = CliRunner().invoke(main, [command, unique.job_id, "-f", str(job_file)], env=env)
        texts.append(result.output)
        if command != "doctor":
            assert result.exit_code == 0, f"{command}: {result.output}"

    texts += [record.getMessage() for record in caplog.records]
    texts += [repr(record.__dict__) for record in caplog.records]
    assert len(caplog.records) > 20, "the run logged almost nothing: the scan would prove little"
    # What was scanned does show the settings around the secrets (the users, redacted DSNs).
    assert any(role.name in text for text in texts)
    assert any(user.name in text for text in texts)
    for what, secret in secrets.items():
        leaks = [text for text in texts if secret in text]
        assert not leaks, f"the {what} appears in: {leaks[0][:300]}"
