"""The Postgres primary and standby (`postgres-standby`) and the main bed's broker as the
servers of a fault test's job (tests/faults/jobs.py `JobServers`): the job and the checks
reach Postgres by the pair's multi-host conninfo, so after a failover both find the promoted
standby; Kafka is the shared broker (each test writes topics of its own).

    bed = StandbyBed(postgres_standby, kafka)
    job = Job(bed, spark, schema, topic, job_id, tmp_path)
    bed.pair.fail_over()                 # the job's next connection reaches the new primary

`repair_epochs` runs the documented repair of epochs a failover to a lagging standby lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from durable_sinks.cli import main
from tests.services import KafkaEndpoint, PostgresEndpoint, PostgresPair, PreparedTransaction


@dataclass(frozen=True)
class StandbyBed:
    pair: PostgresPair
    kafka: KafkaEndpoint

    @property
    def job_postgres(self) -> PostgresEndpoint:
        return self.pair.endpoint()

    @property
    def postgres_direct(self) -> PostgresEndpoint:
        """The pair too: whichever server is primary (checks read what the job's readers
        would, after a failover the new primary's)."""
        return self.pair.endpoint()

    @property
    def job_kafka(self) -> KafkaEndpoint:
        return self.kafka

    @property
    def kafka_direct(self) -> KafkaEndpoint:
        return self.kafka

    def prepared_transactions(self) -> list[PreparedTransaction]:
        """`pg_prepared_xacts` of the current primary."""
        return self.pair.primary.prepared_transactions()


def repair_epochs(job_file: Path, settings: dict[str, Any], env: dict[str, str], *args: str) -> str:
    """`durable-sinks repair-epochs JOB -f job_file --sink postgres ARGS --apply` for the job
    `settings` (a job file's content, written to `job_file`; its DSNs `${NAME}` references
    to `env`, which holds the passwords); its output, which must name no secret."""
    job_file.write_text(json.dumps(settings))
    job_id = str(settings["job_id"])
    result = CliRunner().invoke(
        main,
        ["repair-epochs", job_id, "-f", str(job_file), "--sink", "postgres", *args, "--apply"],
        env=env,
    )
    for secret in env.values():
        assert secret not in result.output
    assert result.exit_code == 0, result.output
    return result.output
