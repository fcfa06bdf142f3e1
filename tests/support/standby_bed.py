"""The documented repair of epochs a failover to a lagging standby lost, as the failover
tests run it. Their jobs run on `Endpoints(postgres_standby.endpoint(), kafka)`
(tests/faults/jobs.py): the job and the checks reach Postgres by the pair's multi-host
conninfo, the same before and after a failover, so both find the promoted standby.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from durable_sinks.cli import main


def repair_epochs(job_file: Path, settings: dict[str, Any], env: dict[str, str], *args: str) -> str:
    """`durable-sinks repair-epochs JOB -f job_file --sink postgres ARGS --apply` for the job
    `settings` (a job file's content, written to `job_file`; its DSNs `${NAME}` references
    to `env`, which holds the passwords); its output, which must name no secret."""
    job_file.write_text(json.dumps(settings))
    job_id = str(settings["job_id"])
    result = CliRunner().invoke(
        main,
        ["repair-epochs", job_id, "-f", str(job_file), "--sink", "postgres", *args, "--apply"],
        env=env,
    )
    for secret in env.values():
        assert secret not in result.output
    assert result.exit_code == 0, result.output
    return result.output
