"""The soak's own logic (tests/soak), without servers: its audit flags every duplicate, loss
and stray row, and its schedule injects each fault kind about equally often."""

from __future__ import annotations

import random
from collections import Counter

from tests.soak.faults import KINDS, Schedule
from tests.soak.verdict import Verdict, counted


def test_every_row_once_passes_and_each_kind_of_miscount_fails() -> None:
    assert counted("S3", [2, 0, 1], 3)[0][2]
    duplicate = counted("S3", [0, 1, 1, 2], 3)[0]
    lost = counted("S3", [0, 2], 3)[0]
    stray = counted("S3", [0, 1, 2, 7], 3)[0]
    assert duplicate[1] == "4 rows; 1 duplicates, 0 lost, 0 unexpected"
    assert lost[1] == "2 rows; 0 duplicates, 1 lost, 0 unexpected"
    assert stray[1] == "4 rows; 0 duplicates, 0 lost, 1 unexpected"
    assert not duplicate[2]
    assert not lost[2]
    assert not stray[2]


def test_one_failed_check_fails_the_verdict_and_the_table_says_which() -> None:
    verdict = Verdict([("a", "1", True), ("b", "2", False)], extra={"command": "x"})
    assert not verdict.passed
    table = verdict.markdown()
    assert "| b | 2 | FAIL |" in table
    assert "| a | 1 | ok |" in table
    assert "| command | x | |" in table
    assert Verdict([("a", "1", True)]).passed


def test_the_schedule_injects_each_kind_once_per_round() -> None:
    schedule = Schedule(random.Random(7))
    drawn = [schedule.next() for _ in range(len(KINDS) * 5)]
    assert Counter(drawn) == dict.fromkeys(KINDS, 5)
    for start in range(0, len(drawn), len(KINDS)):
        assert sorted(drawn[start : start + len(KINDS)]) == sorted(KINDS)
