"""The `durable-sinks` command run as an operator would: after a driver died past the decision
of epoch 0 (three rows, one staged participant left prepared), and to repair epochs a sink's
server lost (a failover to a lagging standby, rows deleted behind the job)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from durable_sinks.cli import main


def resolve_the_decided_leftover(args: Sequence[str]) -> None:
    """`inspect` shows the staged participant and its decision, `resolve --apply` commits
    it, and `verify` then counts the epoch's three rows. `args`: the job and how to reach
    its sinks and store."""
    inspect = CliRunner().invoke(main, ["inspect", *args])
    assert inspect.exit_code == 0, inspect.output
    assert "staging folder" in inspect.output
    assert "decided by generation 1: commit" in inspect.output
    applied = CliRunner().invoke(main, ["resolve", *args, "--apply", "--force"])
    assert applied.exit_code == 0, applied.output
    assert "committed 1, rolled back 0" in applied.output
    verify = CliRunner().invoke(main, ["verify", *args])
    assert verify.exit_code == 0, verify.output
    assert "3 rows counted" in verify.output


def write_job_file(folder: Path, settings: Mapping[str, Any]) -> Path:
    """The job file the operator's commands read (`-f`), `folder`/job.json: `settings` is its
    content (the job id, its decision store, its sinks with their DSNs as `${env:NAME}`
    references)."""
    job_file = folder / "job.json"
    job_file.write_text(json.dumps(settings))
    return job_file


def repair_epochs(job_file: Path, job_id: str, env: Mapping[str, str], *args: str) -> Result:
    """`durable-sinks repair-epochs JOB -f job_file --sink postgres ARGS` with `env` (which
    holds the passwords the job file's references name): its result, whose output names no
    secret."""
    result = CliRunner().invoke(
        main, ["repair-epochs", job_id, "-f", str(job_file), "--sink", "postgres", *args], env=env
    )
    for secret in env.values():
        assert secret not in result.output
    return result
