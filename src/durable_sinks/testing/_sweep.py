"""The scripted sweep run before the generated examples: one example per crash point.

Hypothesis explores at random, and the state machine's path depends on what the real servers
did (a zombie fenced or not, a lock that waited), so even a derandomized run is not the same
sample from one machine to the next: a run of 100 examples once crashed 65 times at
`epoch-start` and never `after-decision`. The sweep makes the coverage certain: for every epoch
step kind, an example that commits an epoch, crashes the next at that step, recovers, replays,
wakes the crashed coordinator as a zombie and replays the committed epoch with other data; for
every recovery step kind, one that crashes recovery after an undecided and after a decided
epoch. The machine's invariants are checked after every step, exactly as in a generated
example; a step kind the scenario never reaches (e.g. `after-commit` with two-phase sinks) is
simply not crashed at, and `ConformanceStats.crashes` shows what was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._scenario import EPOCH_STEP_KINDS, RECOVERY_STEP_KINDS

if TYPE_CHECKING:
    from ._machine import SinkContractMachine

# Fixed epochs: two batches (one with nulls in every value column, one empty), then one row of
# non-ASCII text; the replay of a committed epoch brings different rows.
_FIRST: list[list[tuple[Any, ...]]] = [[(1, "a", 1.5, True), (None, None, None, None)], []]
_SECOND: list[list[tuple[Any, ...]]] = [[(-(2**63), "é ✓", -0.0, False)]]
_OTHER: list[list[tuple[Any, ...]]] = [[(7, "other", 2.0, None)]]

#: Crashes before recovery: one leaves an undecided epoch, one a decided one.
_BEFORE_RECOVERY = ("after-pre-commit", "after-decision")


def sweep(machine_class: type[SinkContractMachine]) -> None:
    """Run the scripted examples against `machine_class` (its `stats` count them as
    `scripted`, not as examples); raise on the first broken invariant."""
    for kind in EPOCH_STEP_KINDS:
        _scripted(machine_class, epoch_crash=kind, recovery_crash=None)
    for kind in RECOVERY_STEP_KINDS:
        for before in _BEFORE_RECOVERY:
            _scripted(machine_class, epoch_crash=before, recovery_crash=kind)


def _scripted(
    machine_class: type[SinkContractMachine], *, epoch_crash: str, recovery_crash: str | None
) -> None:
    machine = machine_class(scripted=True)
    try:
        _step(machine, machine.start_coordinator, None)
        _step(machine, machine.run_epoch, _FIRST, None)
        _step(machine, machine.run_epoch, _SECOND, (epoch_crash, 0))
        if machine.live is None:
            crash = None if recovery_crash is None else (recovery_crash, 0)
            _step(machine, machine.start_coordinator, crash)
        if machine.live is None:
            _step(machine, machine.start_coordinator, None)
        if machine.pending is not None:
            _step(machine, machine.replay_crashed_epoch, None)
        new_epoch = False
        while machine.paused:
            _step(machine, machine.wake_zombie, 0, new_epoch, _OTHER)
            new_epoch = not new_epoch
        _step(machine, machine.replay_committed_epoch, _OTHER)
    except AssertionError as exc:
        steps = "\n".join(f"  {line}" for line in machine.history)
        raise AssertionError(
            f"scripted example (crash at {epoch_crash}, then in recovery at "
            f"{recovery_crash}): {exc}\nits steps:\n{steps}"
        ) from exc
    finally:
        machine.teardown()


def _step(machine: SinkContractMachine, rule: Any, *args: Any) -> None:
    rule(*args)
    machine.no_row_visible_twice_and_nothing_unexpected()
    machine.settled_state_is_exact()
    machine.decisions_never_change()
