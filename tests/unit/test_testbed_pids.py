"""The test bed's pid files: one names the process that wrote it, never a later process the
kernel gave the same pid once the server died without removing its file."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.services._process import process_start, read_pid, start_daemon, stop_group


def test_a_pid_file_names_its_own_process_not_a_later_one_with_its_pid(tmp_path: Path) -> None:
    pid_file = tmp_path / "server.pid"
    pid = start_daemon(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        log=tmp_path / "server.log",
        pid_file=pid_file,
    )
    try:
        started = process_start(pid)
        assert started is not None
        assert pid_file.read_text().split() == [str(pid), str(started)]
        assert read_pid(pid_file) == pid
        # The server died and the kernel gave its pid to another process: another start time.
        pid_file.write_text(f"{pid} {started + 1}\n")
        assert read_pid(pid_file) is None
        # A file a test bed wrote before start times were recorded: the pid alone.
        pid_file.write_text(f"{pid}\n")
        assert read_pid(pid_file) == pid
    finally:
        stop_group("sleeper", pid, timeout=5.0)
    assert read_pid(pid_file) is None
    assert process_start(pid) is None
