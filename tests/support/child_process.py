"""A test's child process that runs a plan: `python -m <module> <name>.json`, the way the Spark
crash, cluster, Connect and soak drivers are started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.services._layout import REPO_ROOT


def start_child(
    module: str, plan: dict[str, Any], folder: Path, name: str
) -> tuple[subprocess.Popen[bytes], Path]:
    """Write `plan` to `folder/<name>.json` and start `python -m module` on it from the
    checkout, in a process group of its own (a kill of the group takes its Spark JVM too),
    stdout and stderr into `folder/<name>.log`. Returns the process and the log's path."""
    plan_file = folder / f"{name}.json"
    plan_file.write_text(json.dumps(plan))
    log = folder / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, str(plan_file)],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, log


def run_child_report(
    module: str, plan: dict[str, Any], folder: Path, name: str, timeout: float = 300
) -> dict[str, Any]:
    """Write `plan` to `folder/<name>.json`, run `python -m module` on it from the checkout
    to its end, and return the JSON report it prints last (a line starting with `{`), with
    the process's `stderr` and `exit` added."""
    plan_file = folder / f"{name}.json"
    plan_file.write_text(json.dumps(plan))
    proc = subprocess.run(
        [sys.executable, "-m", module, str(plan_file)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{module} printed no report (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    report: dict[str, Any] = json.loads(lines[-1])
    report["stderr"] = proc.stderr
    report["exit"] = proc.returncode
    return report
