"""A job's coordinator from its sinks and options (shared by foreachBatch and the data source)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from durable_sinks.coordinator import Coordinator
from durable_sinks.core import DecisionHostingSink, SinkConnector
from durable_sinks.core.errors import ConfigError
from durable_sinks.manifest import (
    DecisionStore,
    HostedDecisionStore,
    default_store_for,
    store_from,
)

from ._options import JobOptions
from ._specs import SinkSpec


def decision_store(specs: Sequence[SinkSpec | SinkConnector], options: JobOptions) -> DecisionStore:
    """The job's decision store: `decision_store` if given, else one a sink can host (the
    first Postgres sink's database, an S3 or Delta sink's folder), else, for a job whose only
    sink keeps its own decisions (Kafka: DecisionHostingSink), that sink; ConfigError when
    there is none."""
    target = options.decision_store
    if target is not None:
        return store_from(target, job=options.job_id)
    for spec in [*specs, *([options.dead_letter] if options.dead_letter is not None else [])]:
        if isinstance(spec, SinkSpec):
            store = default_store_for(spec.kind, spec.config)
            if store is not None:
                return store
    if len(specs) == 1:
        only = specs[0]
        sink = only.build() if isinstance(only, SinkSpec) else only
        if isinstance(sink, DecisionHostingSink):
            return HostedDecisionStore(sink.decision_host())
    raise ConfigError(
        "this job needs a decision store: none of its sinks can host one",
        job=options.job_id,
        fix="give decision_store: a directory on durable storage "
        "(decision_store='/data/checkpoints/orders-decisions') or a Postgres DSN",
    )


def check_job(specs: Sequence[SinkSpec | SinkConnector], options: JobOptions) -> None:
    """Check a job's configuration and servers as a coordinator's start does (validation,
    capabilities, the sinks' tables and fences), then close: a new generation is claimed
    (older coordinators are fenced) but leftovers stay for the coordinator that writes, which
    recovers them. Raises what the start raises."""
    coordinator = build_coordinator(specs, options)
    try:
        coordinator.start(recover=False)
    finally:
        close_quietly(coordinator)


def close_quietly(coordinator: Coordinator) -> None:
    """Close `coordinator`; a failure to close is logged, never raised (closing after an
    error must not hide it)."""
    try:
        coordinator.close()
    except Exception as exc:  # noqa: BLE001 - closing after an error must not hide it
        coordinator.log.debug("closing the coordinator failed: %s", exc)


def build_coordinator(
    specs: Sequence[SinkSpec | SinkConnector],
    options: JobOptions,
    *,
    source: str | None = None,
    on_step: Callable[[str], None] | None = None,
) -> Coordinator:
    """A new, unstarted coordinator with fresh sinks built from `specs`."""
    return Coordinator(
        options.job_id,
        [s.build() if isinstance(s, SinkSpec) else s for s in specs],
        decision_store(specs, options),
        guarantee=options.guarantee,
        executor_mode=options.execution == "executor",
        commit_retry=options.commit_retry,
        retain_epochs=options.retain_epochs,
        one_phase=options.one_phase,
        concurrent_writes=options.concurrent_writes,
        source=source,
        on_step=on_step,
        replay_check=options.replay_check,
        policy=options.write_policy,
        dead_letter=None if options.dead_letter is None else options.dead_letter.build(),
        bad_row_cap=options.bad_row_cap,
        slow_phase_log_s=options.slow_phase_log_s,
        first_epoch=options.first_epoch,
        background_commits=options.background_commits,
    )
