"""`durable-sinks doctor`: the checks `durable_sink(...)` runs at start, one by one, each
failure with its fix, without starting a query."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from durable_sinks.core.errors import DurableSinkError
from durable_sinks.spark._build import check_job

from ._jobfile import job_settings
from ._operator import Operator


def run_checks(params: dict[str, Any], *, read_only: bool) -> Iterator[tuple[str, str | None]]:
    """(check, None) for each check passed, (check, the error with its fix) for a failure.
    Read-only checks first (settings, the store, capabilities, each sink reachable); then,
    unless `read_only` or a coordinator of the job runs, the start's own checks (tables,
    fences, topics, buckets, privileges: `check_job`, which claims a generation but recovers
    nothing, so it would fence a running driver)."""
    try:
        specs, options = job_settings(
            params["job_id"], params["job_file"], params["kind"], params["options"], params["store"]
        )
    except DurableSinkError as exc:
        yield "settings (options, sink kinds, types)", str(exc)
        return
    yield "settings (options, sink kinds, types)", None
    try:
        operator = Operator(specs, options)
    except DurableSinkError as exc:
        yield "decision store, capabilities, sinks reachable (read only)", str(exc)
        return
    with operator:
        yield "decision store, capabilities, sinks reachable (read only)", None
        live = operator.live()
    if read_only:
        return
    what = "start checks (tables, fences, topics, buckets, privileges; claims a generation)"
    if live:
        yield f"{what}: skipped, a coordinator runs ({live})", None
        return
    try:
        check_job(specs, options)
    except DurableSinkError as exc:
        yield what, str(exc)
        return
    yield what, None
