"""The `durable-sinks` command on a job whose sink is a kind installed by entry point: a job
file names it like a built-in kind, its misspelt options are named with the closest one, and
`inspect`, `resolve` and `verify` read it through its operator views."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from click.testing import CliRunner

from durable_sinks.cli import main
from durable_sinks.coordinator import Coordinator
from durable_sinks.manifest import LocalDirectoryStore
from durable_sinks.sinks.folder import ROWS
from durable_sinks.spark import sink
from tests.support.operator_cli import resolve_the_decided_leftover


def rows(start: int, count: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + count), pa.int64())})


def test_a_job_file_with_an_installed_kind(plugin_dists: Path, tmp_path: Path) -> None:
    store, folder, job_id = tmp_path / "decisions", tmp_path / "ledger", "ledger-job"
    coordinator = Coordinator(
        job_id, [sink("ledger", folder=str(folder)).build()], LocalDirectoryStore(store)
    )
    coordinator.start()
    coordinator.run_epoch(0, [rows(0, 7)])
    steps = coordinator.epoch_steps(1, [rows(7, 3)])
    for step in steps:
        if step == "after-decision":  # the driver dies with epoch 1 decided, not committed
            break
    steps.close()
    coordinator.close()
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        f'job_id = "{job_id}"\ndecision_store = "{store}"\n'
        f'[[sinks]]\nkind = "ledger"\nfolder = "{folder}"\n'
    )
    args = [job_id, "-f", str(job_file)]

    resolve_the_decided_leftover(args)

    (part,) = (folder / "epoch=0").glob("part=*")
    with (part / ROWS).open("a") as file:
        file.write('{"id":0}\n')  # a row written twice behind the job's back
    failed = CliRunner().invoke(main, ["verify", *args])
    assert failed.exit_code == 1, failed.output
    assert "in epoch(s) [0]" in failed.output
    assert "holds 8 rows, its marker 7" in failed.output

    job_file.write_text(
        f'job_id = "{job_id}"\ndecision_store = "{store}"\n'
        f'[[sinks]]\nkind = "ledger"\nfoldr = "{folder}"\n'
    )
    misspelt = CliRunner().invoke(main, ["status", *args])
    assert misspelt.exit_code != 0
    assert "unknown option 'foldr'; did you mean 'folder'?" in misspelt.output
