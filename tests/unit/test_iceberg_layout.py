"""An Iceberg participant's data file names read back to the participant, whatever its part
(the driver's, or an executor task attempt's), and never to another job's or sink's."""

from __future__ import annotations

import pytest

from durable_sinks.core.naming import ParticipantName
from durable_sinks.sinks.iceberg.layout import Layout


@pytest.mark.parametrize("part", ["0", "p0-t0", "p199-t123456789", "x" * 40, "A.b_c-9"])
def test_a_file_name_reads_back_to_its_participant(part: str) -> None:
    layout = Layout("orders", "lake")
    name = ParticipantName.build("orders", "lake", 2**40 + 7, part, 12, 3)
    numbers = layout.task_numbers(name)
    for _ in range(3):
        path = f"s3://b/t/data/day=x/00000-{next(numbers)}-{layout.write_uuid(name)}.parquet"
        assert layout.parse(path) == name
    assert Layout("orders", "other").parse(path) is None
    assert Layout("other", "lake").parse(path) is None


def test_two_parts_of_one_epoch_never_share_a_file_name() -> None:
    layout = Layout("orders", "lake")
    names = [ParticipantName.build("orders", "lake", 5, f"p{i}-t{i}", 1, 0) for i in range(50)]
    files = {
        f"00000-{n}-{layout.write_uuid(name)}.parquet"
        for name in names
        for n, _ in zip(layout.task_numbers(name), range(4), strict=False)
    }
    assert len(files) == 200


def test_foreign_files_are_not_read_as_ours() -> None:
    layout = Layout("orders", "lake")
    name = ParticipantName.build("orders", "lake", 1, "p1-t1", 1, 0)
    uuid = layout.write_uuid(name)
    assert layout.parse(f"/data/00000-0-{uuid}.parquet") is None  # no part in the number
    assert layout.parse(f"/data/00000-{2**32 * 0xFF}-{uuid}.parquet") is None  # not ASCII
    assert layout.parse("/data/00000-3-0a7f0c1e-1d5b-4f0e-9a55-3b7bbd1a2c4d.parquet") is None
    assert layout.parse("/data/part-0001.parquet") is None
