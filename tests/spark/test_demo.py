"""The README's demo command works and its summary shows exactly-once after the kill."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import KafkaEndpoint, PostgresEndpoint

DEMO = Path(__file__).resolve().parents[2] / "docs" / "demo.py"
EXACTLY_ONCE = (
    "Postgres rows:                   5000  duplicates 0  lost 0",
    "S3 rows (committed epochs):      5000  duplicates 0  lost 0",
    "Kafka records (read_committed):  5000  duplicates 0  lost 0",
    "prepared transactions left:      0",
    "incomplete S3 uploads left:      0",
    "exactly once: yes",
)


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
    for line in EXACTLY_ONCE:
        assert line in done.stdout, done.stdout
    assert postgres.password not in output


@pytest.mark.timeout(900)
@pytest.mark.fault_tier  # the default suite's tests/spark/test_connect.py kills the server too
def test_demo_through_spark_connect_kills_the_server_and_reports_exactly_once(
    postgres: PostgresEndpoint, kafka: KafkaEndpoint
) -> None:
    done = subprocess.run(
        [sys.executable, str(DEMO), "--connect"],
        capture_output=True,
        text=True,
        timeout=850,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "client exit status 1: the Connect server (the driver) was SIGKILLed" in done.stdout
    assert "replayed; decided before the kill" in done.stdout, done.stdout
    assert "(on the Connect server)" in done.stdout, done.stdout
    for line in EXACTLY_ONCE:
        assert line in done.stdout, done.stdout
    assert postgres.password not in output
