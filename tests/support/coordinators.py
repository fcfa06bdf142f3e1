"""Driving a coordinator in tests: started (a refused start closes what it opened) and an
epoch's steps run up to a named one, as a driver that crashed there would leave it."""

from __future__ import annotations

from collections.abc import Iterator

from durable_sinks.coordinator import Coordinator


def started(coordinator: Coordinator) -> Coordinator:
    """`coordinator`, started (its sinks opened, older generations fenced, leftovers
    resolved); closed again when the start is refused."""
    try:
        coordinator.start()
    except BaseException:
        coordinator.close()
        raise
    return coordinator


def run_until(steps: Iterator[str], wanted: str) -> None:
    """Drive an epoch's steps up to `wanted` and stop there, as a crashed driver would (the
    caller keeps `steps` alive, so nothing runs on clean-up)."""
    for step in steps:
        if step == wanted:
            return
    raise AssertionError(f"the epoch never reached {wanted}")
