"""The recovery table (docs/protocol.md, "Recovery") as a pure function, and the report of a
recovery."""

from __future__ import annotations

from dataclasses import dataclass, field

from durable_sinks.core import CommitHandle
from durable_sinks.core.errors import FencedError
from durable_sinks.core.text_enum import TextEnum
from durable_sinks.manifest import DecisionRecord


class Resolution(TextEnum):
    COMMIT = "commit"
    ROLL_BACK = "roll_back"

    def __repr__(self) -> str:
        return f"Resolution.{self.name}"


def resolve(decision: DecisionRecord | None, handle: CommitHandle) -> Resolution:
    """What to do with a participant an earlier generation left prepared. Presumed abort:

    | decision for its epoch          | participant | action    |
    |---------------------------------|-------------|-----------|
    | commit, lists this participant  | prepared    | commit    |
    | commit, lists another attempt   | prepared    | roll back |
    | none (undecided)                | prepared    | roll back |

    (Committed participants are not prepared any more, so they never reach this table.)
    Rolling back an undecided participant is safe only once the store has fenced older
    generations, so none of them can still decide the epoch: the coordinator calls this after
    `DecisionStore.open`.
    """
    if decision is not None and decision.commits(handle):
        return Resolution.COMMIT
    return Resolution.ROLL_BACK


def require_no_newer(job: str, newest: int, mine: int) -> None:
    """FencedError when a generation newer than `mine` (this driver's last) was claimed:
    another driver of the job started while this one was riding out an outage, and this one
    must stop rather than take the job back (Coordinator.start's `successor_of`)."""
    if newest > mine:
        raise FencedError(
            f"while this driver (generation {mine}) was riding out an outage, another driver "
            f"of the job claimed generation {newest}; this one stops rather than take the job "
            "back",
            job=job,
        )


@dataclass
class RecoveryReport:
    """What recovery at start-up found and did. Only what was really done is counted: a
    participant is in `committed` or `rolled_back` once that call returned; `adopted` are
    leftovers left alone on purpose (the parts of the epoch being decided, see
    Coordinator.start); `ran` is False when recovery was not asked for (`recover=False`), and
    then nothing was looked for."""

    generation: int
    committed: list[CommitHandle] = field(default_factory=list)
    rolled_back: list[CommitHandle] = field(default_factory=list)
    adopted: list[CommitHandle] = field(default_factory=list)
    ran: bool = True

    def __str__(self) -> str:
        if not self.ran:
            return (
                f"generation {self.generation}: recovery not run here; leftovers are left to "
                "the next coordinator that recovers"
            )
        found = len(self.committed) + len(self.rolled_back) + len(self.adopted)
        text = (
            f"generation {self.generation}: {found} leftover participant"
            f"{'' if found == 1 else 's'} found; committed {len(self.committed)}, rolled back "
            f"{len(self.rolled_back)}"
        )
        return f"{text}, adopted {len(self.adopted)}" if self.adopted else text
