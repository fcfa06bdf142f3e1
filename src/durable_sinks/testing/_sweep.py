"""The scripted sweep run before the generated examples: one example per crash point.

Hypothesis explores at random, and the state machine's path depends on what the real servers
did (a zombie fenced or not, a lock that waited), so even a derandomized run is not the same
sample from one machine to the next: a run of 100 examples once crashed 65 times at
`epoch-start` and never `after-decision`. The sweep makes the coverage certain: for every epoch
step kind, an example that commits an epoch, crashes the next at that step, recovers, replays,
wakes the crashed coordinator as a zombie and replays the committed epoch with other data; for
every recovery step kind, one that crashes recovery after an undecided and after a decided
epoch. With a dead-letter target, one more example per participant after the first, for each
step kind a participant passes (begin, write, prepare, commit): a crash then falls on the dead
letters' own steps, wherever the coordinator puts them. The machine's invariants are checked
after every step, exactly as in a generated example; a step kind the scenario never reaches
(e.g. `after-commit` with two-phase sinks) is simply not crashed at, and
`ConformanceStats.crashes` shows what was.
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


#: Step kinds every participant passes: with a dead letter, crashed at each participant's.
_PER_PARTICIPANT = ("after-begin", "after-write", "after-pre-commit", "after-commit")


def sweep(machine_class: type[SinkContractMachine]) -> None:
    """Run the scripted examples against `machine_class` (its `stats` count them as
    `scripted`, not as examples); raise on the first broken invariant."""
    participants = 1
    for kind in EPOCH_STEP_KINDS:
        participants = _scripted(machine_class, epoch_crash=kind, recovery_crash=None)
    for kind in RECOVERY_STEP_KINDS:
        for before in _BEFORE_RECOVERY:
            _scripted(machine_class, epoch_crash=before, recovery_crash=kind)
    if participants > 1:  # a dead-letter target: each participant's step is crashed at
        for kind in _PER_PARTICIPANT:
            for nth in range(1, participants):
                _scripted(machine_class, epoch_crash=kind, recovery_crash=None, nth=nth)


def _scripted(
    machine_class: type[SinkContractMachine],
    *,
    epoch_crash: str,
    recovery_crash: str | None,
    nth: int = 0,
) -> int:
    """One scripted example, crashing the second epoch after the `nth` step of the kind
    `epoch_crash`; returns how many participants the scenario has if it has a dead-letter
    target (its targets and the dead letter), else 1."""
    machine = machine_class(scripted=True)
    dead_letter = machine.scenario.dead_letter is not None
    try:
        _step(machine, machine.start_coordinator, None)
        _step(machine, machine.run_epoch, _FIRST, None)
        _step(machine, machine.run_epoch, _SECOND, (epoch_crash, nth))
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
            f"scripted example (crash at {epoch_crash} #{nth}, then in recovery at "
            f"{recovery_crash}): {exc}\nits steps:\n{steps}"
        ) from exc
    finally:
        machine.teardown()
    return len(machine.scenario.targets) + 1 if dead_letter else 1


def _step(machine: SinkContractMachine, rule: Any, *args: Any) -> None:
    rule(*args)
    machine.no_row_visible_twice_and_nothing_unexpected()
    machine.settled_state_is_exact()
    machine.decisions_never_change()
