"""The Postgres primary and standby (`postgres-standby`) and the main bed's broker as the
servers of a fault test's job (tests/faults/jobs.py `JobServers`): the job and the checks
reach Postgres by the pair's multi-host conninfo, so after a failover both find the promoted
standby; Kafka is the shared broker (each test writes topics of its own).

    bed = StandbyBed(postgres_standby, kafka)
    job = Job(bed, spark, schema, topic, job_id, tmp_path)
    bed.pair.fail_over()                 # the job's next connection reaches the new primary
"""

from __future__ import annotations

from dataclasses import dataclass

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
