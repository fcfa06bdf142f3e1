"""Validation at job start (docs/protocol.md, "Validation at start"): raise before anything
is written.

Each CapabilityError names the sink, what is missing, and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence

from durable_sinks.core import (
    DeliveryGuarantee,
    DistributedSink,
    LastResource,
    SharesTransactions,
    SinkConnector,
)
from durable_sinks.core.bad_rows import WritePolicy
from durable_sinks.core.errors import CapabilityError, ConfigError
from durable_sinks.manifest import DecisionStore, HostedDecisionStore


def validate(
    job_id: str,
    sinks: Sequence[SinkConnector],
    store: DecisionStore,
    guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE,
    *,
    executor_mode: bool = False,
    one_phase: bool = True,
    dead_letter: SinkConnector | None = None,
    policy: WritePolicy | None = None,
) -> LastResource | None:
    """Check that `sinks` and `store` can give `guarantee`; return the job's commit point if a
    sink carries it: the one non-resumable participant (the last resource), or, with
    `one_phase`, the job's only sink when it can carry the decision in its own commit (a
    single-participant job may skip two-phase commit: the marker in the same transaction is
    enough; not in executor mode, where every partition is its own participant). A store
    kept by a sink (HostedDecisionStore) is refused unless that sink is the job's only sink
    and its commit point: only then is every decision in that sink's commits.

    `dead_letter`, one of `sinks`, is the job's dead-letter sink: it does not count as a
    second sink of a one-phase job (a resumable one is prepared before the commit point's
    one-phase commit, which carries the decision naming it). `policy` must match it: a
    dead-letter sink exactly when bad rows go to one; `add_columns` only with targets that
    can evolve their schema."""
    targets = [s for s in sinks if s is not dead_letter]
    _check_policy(job_id, targets, dead_letter, policy or WritePolicy())
    last = _commit_point(
        job_id,
        sinks,
        store,
        guarantee,
        executor_mode=executor_mode,
        one_phase=one_phase,
        dead_letter=dead_letter,
    )
    if isinstance(store, HostedDecisionStore):
        names = [s.name for s in targets]
        if names != [store.sink] or (
            guarantee is DeliveryGuarantee.EXACTLY_ONCE
            and (last is None or last.name != store.sink)
        ):
            raise CapabilityError(
                f"the decision store is kept by sink {store.sink!r}, which holds only the "
                f"decisions its own commits carry; this job writes to {names}",
                job=job_id,
                sink=store.sink,
                fix="give the job a decision_store (a directory on durable storage, a Postgres "
                "DSN or an s3:// location) when it writes to more than that one sink",
            )
    return last


def _commit_point(
    job_id: str,
    sinks: Sequence[SinkConnector],
    store: DecisionStore,
    guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE,
    *,
    executor_mode: bool = False,
    one_phase: bool = True,
    dead_letter: SinkConnector | None = None,
) -> LastResource | None:
    if not job_id or not job_id.strip():
        raise ConfigError("job_id is empty", fix="give every streaming query a stable job_id")
    if not sinks:
        raise ConfigError("no sinks configured", job=job_id, fix="give at least one sink")
    names = [s.name for s in sinks]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(
            f"sink names {duplicates} are used more than once",
            job=job_id,
            fix="give each sink of a job its own name",
        )
    if executor_mode:
        for sink in sinks:
            if not sink.capabilities().distributed_prepare or not isinstance(sink, DistributedSink):
                raise CapabilityError(
                    "executor mode needs sinks that executors can prepare and the driver "
                    "can commit (distributed_prepare); this one cannot",
                    job=job_id,
                    sink=sink.name,
                    fix="use driver mode (the default) for this job",
                )
    if guarantee is not DeliveryGuarantee.EXACTLY_ONCE:
        return None
    if not store.durable:
        raise CapabilityError(
            f"exactly-once needs a durable decision store; {type(store).__name__} is not",
            job=job_id,
            fix="use LocalDirectoryStore (or another durable store), or ask for at-least-once",
        )
    last_resources: list[SinkConnector] = []
    for sink in sinks:
        caps = sink.capabilities()
        if not caps.exactly_once:
            raise CapabilityError(
                "this sink cannot give exactly-once delivery",
                job=job_id,
                sink=sink.name,
                fix="ask for DeliveryGuarantee.AT_LEAST_ONCE, or use an exactly-once sink",
            )
        if not caps.two_phase_commit:
            raise CapabilityError(
                "exactly-once across sinks needs two-phase commit; this sink has none",
                job=job_id,
                sink=sink.name,
                fix="use a sink with two_phase_commit",
            )
        if not caps.resumable_prepare:
            last_resources.append(sink)
    # The carrier of the decision: a target before the dead letter (which joins only the
    # epochs that have dead letters).
    last_resources.sort(key=lambda s: s is dead_letter)
    _check_one_transaction(job_id, last_resources, dead_letter)
    if not last_resources:
        targets = [s for s in sinks if s is not dead_letter]
        only = targets[0]
        if one_phase and len(targets) == 1 and not executor_mode and isinstance(only, LastResource):
            return only
        return None
    last = last_resources[0]
    if not isinstance(last, LastResource):
        raise CapabilityError(
            "this sink cannot resume a prepared epoch and cannot carry the commit decision "
            "(commit_with_decision/read_decision), so a crash could lose or duplicate an epoch",
            job=job_id,
            sink=last.name,
            fix="implement the LastResource protocol for it",
        )
    return last


def transaction_members(
    sinks: Sequence[SinkConnector], last: SinkConnector | None
) -> tuple[str, ...]:
    """The names of the sinks whose participants ride in `last`'s transaction (`last` first,
    then the others of its transaction group in the job's order); empty when `last` shares
    its transactions with no other sink."""
    if last is None or not isinstance(last, SharesTransactions):
        return ()
    group = last.transaction_group()
    riders = [
        s.name
        for s in sinks
        if s is not last
        and isinstance(s, SharesTransactions)
        and not s.capabilities().resumable_prepare
        and s.transaction_group() == group
    ]
    return (last.name, *riders) if riders else ()


def _check_one_transaction(
    job_id: str, last_resources: Sequence[SinkConnector], dead_letter: SinkConnector | None
) -> None:
    """Sinks that cannot resume a prepared epoch fit in one job only when they share one
    transaction (one transaction group): only one commit can carry the decision."""
    if len(last_resources) < 2:
        return
    groups = [
        s.transaction_group() if isinstance(s, SharesTransactions) else None for s in last_resources
    ]
    if None not in groups and len(set(groups)) == 1:
        return
    said = "; ".join(
        f"{s.name!r}: {g if g is not None else 'a transaction of its own'}"
        for s, g in zip(last_resources, groups, strict=True)
    )
    why = (
        f"cannot resume a prepared epoch after a crash, and they do not share one transaction "
        f"({said}): only one commit can carry the epoch's decision"
    )
    if dead_letter is not None and dead_letter in last_resources:
        others = [s.name for s in last_resources if s is not dead_letter]
        raise CapabilityError(
            f"the dead-letter sink {dead_letter.name!r} and the target(s) {others} {why}",
            job=job_id,
            sink=dead_letter.name,
            fix="put the dead-letter topic on the target's Kafka cluster (the same "
            "bootstrap_servers: one transaction carries both), or give the job a dead letter "
            "that can resume a prepared epoch: dead_letter=sink('postgres', dsn=..., "
            "table='events_dead_letters', create_table=True), an S3 prefix (sink('s3', ...)) "
            "or a files path (sink('files', path=...))",
        )
    raise CapabilityError(
        f"sinks {[s.name for s in last_resources]} {why}",
        job=job_id,
        fix="write these topics through one Kafka cluster (the same bootstrap_servers), or "
        "split the job into one job per cluster",
    )


def _check_policy(
    job_id: str,
    targets: Sequence[SinkConnector],
    dead_letter: SinkConnector | None,
    policy: WritePolicy,
) -> None:
    if policy.isolates and dead_letter is None:
        raise ConfigError(
            "on_bad_rows='dead_letter' needs a dead-letter sink",
            job=job_id,
            fix="durable_sink(..., on_bad_rows='dead_letter', dead_letter=sink('postgres', "
            "dsn=..., table='events_dead_letters', create_table=True)) (or a Kafka topic, an "
            "S3 prefix, a files path)",
        )
    if dead_letter is not None and not policy.isolates:
        raise ConfigError(
            "a dead-letter sink is given but bad rows fail the epoch (on_bad_rows='fail')",
            job=job_id,
            sink=dead_letter.name,
            fix="add on_bad_rows='dead_letter', or drop dead_letter",
        )
    if policy.adds_columns:
        for sink in targets:
            if not sink.capabilities().schema_evolution:
                raise CapabilityError(
                    "schema_evolution='add_columns' needs sinks that can add columns to their "
                    "target in an epoch; this one cannot",
                    job=job_id,
                    sink=sink.name,
                    fix="leave schema_evolution out for this job (new columns are then refused "
                    "with SchemaMismatchError naming them), or drop this sink",
                )
