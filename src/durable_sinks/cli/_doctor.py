"""`durable-sinks doctor`: the checks `durable_sink(...)` runs at start, one by one, each
failure with its fix, without starting a query."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from durable_sinks.core.errors import DurableSinkError
from durable_sinks.core.operations import InformingSink
from durable_sinks.spark._build import check_job

from ._jobfile import job_settings
from ._operator import Operator


class CheckLine(NamedTuple):
    """One line of doctor's report: a check and its failure (None: passed), or, when
    `informational`, a sink's note (what it found, never a failure)."""

    check: str
    problem: str | None
    informational: bool = False


def run_checks(params: dict[str, Any], *, read_only: bool) -> Iterator[CheckLine]:
    """(check, None) for each check passed, (check, the error with its fix) for a failure.
    Read-only checks first (settings, the store, capabilities, each sink reachable), with
    each sink's notes (InformingSink: informational lines, e.g. the Kafka sink's KIP-939
    probe; a note that cannot be read is a note too); then, unless `read_only` or a
    coordinator of the job runs, the start's own checks (tables, fences, topics, buckets,
    privileges: `check_job`, which claims a generation but recovers nothing, so it would
    fence a running driver)."""
    try:
        specs, options = job_settings(
            params["job_id"], params["job_file"], params["kind"], params["options"], params["store"]
        )
    except DurableSinkError as exc:
        yield CheckLine("settings (options, sink kinds, types)", str(exc))
        return
    yield CheckLine("settings (options, sink kinds, types)", None)
    try:
        operator = Operator(specs, options)
    except DurableSinkError as exc:
        yield CheckLine("decision store, capabilities, sinks reachable (read only)", str(exc))
        return
    with operator:
        yield CheckLine("decision store, capabilities, sinks reachable (read only)", None)
        for sink in operator.sinks:
            if isinstance(sink, InformingSink):
                try:
                    notes = sink.notes()
                except DurableSinkError as exc:
                    notes = [(f"sink {sink.name!r}", f"its notes could not be read: {exc}")]
                for what, found in notes:
                    yield CheckLine(f"{what}: {found}", None, informational=True)
        live = operator.live()
    if read_only:
        return
    what = "start checks (tables, fences, topics, buckets, privileges; claims a generation)"
    if live:
        yield CheckLine(f"{what}: skipped, a coordinator runs ({live})", None)
        return
    try:
        check_job(specs, options)
    except DurableSinkError as exc:
        yield CheckLine(what, str(exc))
        return
    yield CheckLine(what, None)
