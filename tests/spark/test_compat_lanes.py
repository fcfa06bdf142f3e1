"""The compatibility lanes' smoke subset (tests/compat_lanes.py --smoke), run by `make test-fresh`:
on Python 3.10 with pyspark 3.5.0 and on Python 3.13 with pyspark 4.3.0, both driver-mode
reads, a writer in each mode, `format("durable")` or its refusal, and the install that keeps
the user's pyspark. `make test-compat` runs the lanes' whole set, SIGKILLed drivers included."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.services import KafkaEndpoint, PostgresEndpoint, S3Endpoint
from tests.services._layout import REPO_ROOT
from tests.services.compat import LANES


@pytest.mark.slow
@pytest.mark.compat_tier
def test_the_oldest_and_newest_supported_spark_and_python_pass_the_smoke_subset(
    postgres: PostgresEndpoint, kafka: KafkaEndpoint, s3: S3Endpoint
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.compat_lanes", "--smoke"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    output = done.stdout + done.stderr
    verdicts = [
        line for line in done.stdout.splitlines() if line.startswith("== lane") and " in " in line
    ]
    assert done.returncode == 0, output[-6000:]
    assert len(verdicts) == len(LANES), output[-6000:]
    assert all(": passed in " in line for line in verdicts), verdicts
