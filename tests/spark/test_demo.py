"""The README's demo command works and its summary shows exactly-once after the kill."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import KafkaEndpoint, PostgresEndpoint

DEMO = Path(__file__).resolve().parents[2] / "docs" / "demo.py"


@pytest.mark.timeout(900)
def test_demo_kills_its_driver_and_reports_zero_duplicates_and_losses(
    postgres: PostgresEndpoint, kafka: KafkaEndpoint
) -> None:
    done = subprocess.run(
        [sys.executable, str(DEMO)], capture_output=True, text=True, timeout=850, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "driver exit status -9 (SIGKILL)" in done.stdout, done.stdout
    assert "recovery: generation 2: 2 leftover participants found; committed 2" in done.stdout, (
        done.stdout
    )
    assert "Postgres rows:                   5000  duplicates 0  lost 0" in done.stdout
    assert "S3 rows (committed epochs):      5000  duplicates 0  lost 0" in done.stdout
    assert "Kafka records (read_committed):  5000  duplicates 0  lost 0" in done.stdout
    assert "prepared transactions left:      0" in done.stdout
    assert "incomplete S3 uploads left:      0" in done.stdout
    assert "exactly once: yes" in done.stdout
    assert postgres.password not in output
