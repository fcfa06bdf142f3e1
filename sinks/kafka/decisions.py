"""A job's decisions and generations kept in the Kafka sink's progress topic, so that a job
whose only sink is Kafka needs no decision store (a `DecisionHost`; the manifest layer's
HostedDecisionStore makes it the job's store).

Decisions: the sink is the job's last resource, so each epoch's progress record, committed in
the epoch's own transaction, carries the epoch's decision record (progress.py). A decision is
read back as the latest `<owner>progress` record of the epoch, `read_committed`.

Generations: a claim is a record `<owner>generation = {generation}` and the same generation
as the sink's fence record `<owner>fence` (progress.py), written in one transaction of the
sink's own transactional.id:

1. `init_transactions` with that id. The transaction coordinator bumps the id's producer
   epoch, which fences every older producer of it (a zombie coordinator's sink: its next
   call, `commit_transaction` included, fails), and completes or aborts whatever that
   producer had open before it answers, so every transaction committed with the id before
   is fully written to the progress topic.
2. Read the newest generation: the higher of the latest `generation` and `fence` records,
   read_committed, up to the partition's high watermark (so every claim and every fence
   committed before step 1 is seen).
3. Write both records with `newest + 1` and commit.

Why this is a compare-and-swap: a claim's commit succeeds only if no other producer called
`init_transactions` with the id between its step 1 and its commit (that call would have
fenced it). So successful claims are totally ordered, each one's step 1 after the previous
one's commit, and each reads the previous one's value in step 2: two claims never return the
same generation, and each returns more than every claim before. A claim fenced in the
middle (two drivers starting at once) starts again from step 1, a bounded number of times; a
claim whose commit outcome is unknown raises TransientError (the driver's start fails and is
retried), and if it did land the next claim only claims one more. Step 1 is also what
fences: once a claim returns, an older coordinator's transaction can no longer commit, and a
sink opened by an older generation reads the claim's fence record and refuses to start
(sink.py). The `generation` record is
written only by claims, so it never goes down even if a fence record did; the sink itself
reads only the fence record, which a job with a decision store of its own has alone.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from durable_sinks.core.errors import FencedError
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.protocol import JSON

from .admin import Cluster
from .clientlog import ClientLog
from .config import Kafka
from .progress import (
    ProgressReader,
    ProgressRecord,
    encode_fence,
    fence_holder,
    fence_key,
    generation_key,
    progress_key,
    transactional_id,
)
from .writer import TransactionalProducer

#: How often a claim fenced by a concurrent claim starts again before it gives up, and the
#: longest pause (seconds, random, grows with the attempt) before it does: drivers that
#: start at the same moment would otherwise keep fencing each other's claims.
CLAIM_ATTEMPTS = 8
CLAIM_PAUSE_S = 0.25


class _Clients:
    """The admin client and progress reader of one job's host."""

    def __init__(self, config: Kafka, job_id: str) -> None:
        self.job_id = job_id
        self.clientlog = ClientLog(job_id, config.name)
        self.log = JobLogger(job_id, config.name, component="sinks.kafka.decisions")
        settings = {**config.connection_settings(), **self.clientlog.settings()}
        self.cluster = Cluster(config, settings, self.where, self.log, self.clientlog.refusals)
        self.progress = ProgressReader(
            self.cluster.admin,
            settings,
            config.progress_topic_name,
            config.progress_scan_timeout_s,
            self.where,
            request_timeout=config.request_timeout_s,
        )
        self.sink = config.name

    def where(self, epoch: int | None = None) -> dict[str, Any]:
        return {"job": self.job_id, "sink": self.sink, "epoch": epoch}

    def close(self) -> None:
        self.progress.close()
        self.clientlog.flush()


class KafkaDecisionHost:
    """One job's decisions and generations in a Kafka sink's progress topic (see the module
    docs). Built from the sink's configuration alone; its clients are its own, made on first
    use for the job asked about."""

    def __init__(self, config: Kafka) -> None:
        self.config = config
        self._clients: _Clients | None = None

    def __repr__(self) -> str:
        return f"KafkaDecisionHost(sink={self.sink!r}, progress_topic={self._topic!r})"

    @property
    def sink(self) -> str:
        return self.config.name

    @property
    def _topic(self) -> str:
        return self.config.progress_topic_name

    def _for(self, job_id: str) -> _Clients:
        if self._clients is not None and self._clients.job_id != job_id:
            self.close()
        if self._clients is None:
            self._clients = _Clients(self.config, job_id)
        return self._clients

    def claim_generation(self, job_id: str) -> int:
        """Claim the next generation (the module docs say why it is a compare-and-swap).
        Makes the topics the sink would make at open (create_topic, the progress topic) and
        checks the cluster as the sink's open does. FencedError when concurrent claims won
        every attempt; TransientError when the cluster cannot be reached."""
        clients = self._for(job_id)
        clients.cluster.check()
        producer = TransactionalProducer(
            self.config,
            transactional_id(job_id, self.sink),
            clients.where,
            clients.log,
            clients.clientlog,
        )
        producer.check_settings()
        try:
            for attempt in range(1, CLAIM_ATTEMPTS + 1):
                producer.start()
                claimed = self.newest_generation(job_id) + 1
                value = encode_fence(claimed)
                try:
                    producer.write_together(
                        f"claiming generation {claimed}",
                        self._topic,
                        [
                            (generation_key(job_id, self.sink), value),
                            (fence_key(job_id, self.sink), value),
                        ],
                    )
                except FencedError:
                    if attempt == CLAIM_ATTEMPTS:
                        raise
                    clients.log.info(
                        "another driver of the job claimed a generation at the same time; "
                        "claiming again (attempt %d of %d)",
                        attempt + 1,
                        CLAIM_ATTEMPTS,
                    )
                    time.sleep(random.uniform(0, CLAIM_PAUSE_S * attempt))  # noqa: S311 - jitter
                    continue
                clients.log.info("claimed generation %d in %s", claimed, self._topic)
                return claimed
        finally:
            producer.close()
        raise AssertionError("unreachable: the last attempt returns or raises")

    def newest_generation(self, job_id: str) -> int:
        clients = self._for(job_id)
        found = clients.progress.latest(
            {fence_key(job_id, self.sink): _any, generation_key(job_id, self.sink): _any}
        )
        return fence_holder(self._topic, found) or 0

    def decision(self, job_id: str, epoch: int) -> Mapping[str, JSON] | None:
        record = self._latest(job_id, lambda r: r.epoch <= epoch)
        if record is None or record.epoch != epoch:
            return None
        return record.decision

    def latest_decided(self, job_id: str) -> int | None:
        record = self._latest(job_id, lambda r: True)
        return record.epoch if record is not None else None

    def _latest(
        self, job_id: str, accept: Callable[[ProgressRecord], bool]
    ) -> ProgressRecord | None:
        """The latest progress record of the job's sink that `accept`s."""
        clients = self._for(job_id)
        key = progress_key(job_id, self.sink)
        decoded: dict[int, ProgressRecord] = {}

        def check(value: bytes, offset: int) -> bool:
            decoded[offset] = ProgressRecord.decode(value, f"{self._topic}@{offset}")
            return accept(decoded[offset])

        found = clients.progress.latest({key: check})
        return decoded[found[key][0]] if key in found else None

    def close(self) -> None:
        clients, self._clients = self._clients, None
        if clients is not None:
            clients.close()


def _any(value: bytes, offset: int) -> bool:
    return True
