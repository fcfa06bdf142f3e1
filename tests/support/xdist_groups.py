"""Tests that hold one serial resource of the test bed run on one pytest-xdist worker.

The faults bed, the killable Spark Connect server, the Spark standalone cluster, the Postgres
primary with its standby, the Kafka cluster and the private beds' ports are each held by one
test at a time (a file lock in their fixture). Spread over both workers, such tests would run
one at a time anyway, the second worker idling on the lock instead of running other tests.
`--dist loadgroup` sends every test of one `xdist_group` to one worker as one unit of work;
the largest units are handed out first (`--loadscope-reorder`, xdist's default), so the long
serial chains start early.

xdist's worker tells its scheduler a test's group by appending `@<group>` to the test's node
id, and pytest 9.2 no longer reads the attribute xdist writes (`item._nodeid`; pytest now
keeps a structured id), so the groups silently stopped forming (pytest-xdist issue #1386).
`mark_groups` writes the suffix where this pytest keeps the id, the same change as the fix
proposed upstream; it does nothing where xdist's own suffix took effect.
`tests/unit/test_xdist_groups.py` runs a small suite on two workers and checks that each
group ran on one worker.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

#: The fixture that holds a serial resource -> the group of every test that takes it.
GROUP_OF_FIXTURE = {
    "fault_bed": "faults",
    "killable_connect": "faults-connect",
    "spark_cluster": "spark-cluster",
    "kafka_cluster": "kafka-cluster",
    "private_ports": "private-ports",
    "postgres_standby": "postgres-standby",
}


def add_group_marks(items: Sequence[pytest.Item]) -> None:
    """Mark each test that takes a serial resource's fixture with that resource's group."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, group in GROUP_OF_FIXTURE.items():
            if fixture in fixtures:
                item.add_marker(pytest.mark.xdist_group(group))


def mark_groups(config: pytest.Config, items: Sequence[pytest.Item]) -> None:
    """On a worker of `--dist loadgroup`, make each grouped test's node id end in `@<group>`
    (xdist's own format: the groups of a test sorted and joined by `_`)."""
    if not config.getoption("loadgroup", default=False):
        return
    for item in items:
        groups = sorted(
            {
                str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                for mark in item.iter_markers("xdist_group")
            }
        )
        if not groups or _has_group_suffix(item.nodeid):
            continue
        grouped = f"{item.nodeid}@{'_'.join(groups)}"
        structured = getattr(item, "_id", None)
        if structured is not None and not isinstance(structured, str):
            item._id = type(structured).parse(grouped)
        else:
            item._nodeid = grouped  # type: ignore[attr-defined]
        if item.nodeid != grouped:
            raise pytest.UsageError(
                f"could not give {item.nodeid} its xdist group (this pytest keeps node ids "
                "in a way tests/support/xdist_groups.py does not know): update it"
            )


def _has_group_suffix(nodeid: str) -> bool:
    """xdist's own test of a group suffix (an `@` after the last `]`)."""
    return nodeid.rfind("@") > nodeid.rfind("]")
