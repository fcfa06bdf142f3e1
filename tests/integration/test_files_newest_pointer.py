"""The files sink's newest-epoch pointer with the Postgres decision store (the test bed's
server): a driver that dies between a publish's pointer entry and its rename, or between the
rename and the removal of the older entries, and a folder whose pointer is gone, each start
again and deliver every epoch exactly once; the lost-epoch check still stops a start whose
folder lost its newest epoch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable_sinks import CommittedEpochLostError
from durable_sinks.coordinator import Coordinator, EpochOutcome
from durable_sinks.manifest.postgres import PostgresDecisionStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.sinks.folder import committer as folder_committer
from durable_sinks.sinks.folder.layout import NEWEST, Layout
from tests.services import PostgresEndpoint


class Crash(BaseException):
    """The driver process dies here."""


def batch(epoch: int) -> pa.RecordBatch:
    return pa.record_batch({"id": [epoch * 10, epoch * 10 + 1], "v": [f"{epoch}", "x"]})


def start(folder: Path, postgres: PostgresEndpoint, schema: str, job_id: str) -> Coordinator:
    made = Coordinator(
        job_id,
        [FolderSink(Files(str(folder), name="files"))],
        PostgresDecisionStore(postgres.conninfo(), schema=schema),
    )
    made.start()
    return made


def delivered(folder: Path) -> list[int]:
    """Every row id in the committed parts, in order (duplicates kept)."""
    ids: list[int] = []
    for marker in sorted(folder.glob("epoch=*/part=*/_EPOCH.json")):
        for file in sorted(marker.parent.glob("*.parquet")):
            ids.extend(pq.read_table(file).column("id").to_pylist())
    return sorted(ids)


@pytest.mark.parametrize("where", ["after-entry", "after-rename", "pointer-removed"])
def test_a_start_after_a_crash_around_the_pointer_delivers_exactly_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    postgres: PostgresEndpoint,
    pg_schema: str,
    job_id: str,
    where: str,
) -> None:
    folder = tmp_path / "files"
    first = start(folder, postgres, pg_schema, job_id)
    for epoch in range(3):
        assert first.run_epoch(epoch, [batch(epoch)]).outcome is EpochOutcome.COMMITTED
    first.close()

    crashing = start(folder, postgres, pg_schema, job_id)
    with monkeypatch.context() as patched:
        if where == "after-entry":

            def die(source: Path, target: Path) -> None:
                raise Crash

            patched.setattr(folder_committer, "rename_noreplace", die)
        elif where == "after-rename":

            def dead(self: Layout, epoch: int) -> None:
                raise Crash

            patched.setattr(Layout, "retire_below", dead)
        if where == "pointer-removed":
            assert crashing.run_epoch(3, [batch(3)]).outcome is EpochOutcome.COMMITTED
            crashing.close()
            shutil.rmtree(folder / NEWEST)
        else:
            with pytest.raises(Crash):
                crashing.run_epoch(3, [batch(3)])

    restarted = start(folder, postgres, pg_schema, job_id)
    assert restarted.lost_epochs.newest == 3
    assert restarted.run_epoch(3, [batch(3)]).outcome is EpochOutcome.ALREADY_COMMITTED
    assert restarted.run_epoch(4, [batch(4)]).outcome is EpochOutcome.COMMITTED
    restarted.close()
    assert sorted(p.name for p in (folder / NEWEST).iterdir()) == ["4"]
    assert delivered(folder) == sorted(i for e in range(5) for i in (e * 10, e * 10 + 1))

    shutil.rmtree(folder / "epoch=4")  # the folder loses its newest epoch; its entry stays
    with pytest.raises(CommittedEpochLostError, match="files"):
        start(folder, postgres, pg_schema, job_id)
