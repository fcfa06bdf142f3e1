"""The service scripts themselves: `up` twice is harmless, `down` leaves no process behind, a
taken port is named in a clear error, and a test whose server is unreachable fails (never
skips). A second, private test bed on other ports keeps the shared one untouched."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import Layout, ServiceError, Testbed, down, up
from tests.services._layout import REPO_ROOT
from tests.services._process import group_members, pid_alive, port_is_free
from tests.testbed.test_s3 import RESTART_OFFSET

SERVERS = ("postgres", "kafka", "s3", "moto")
FAULTS = ("faults-postgres", "faults-kafka", "toxiproxy")


#: Every test here holds the private beds' ports (one such test at a time across workers).
pytestmark = pytest.mark.usefixtures("private_ports")

#: Private beds of these tests: every port of the shared bed + PRIVATE_OFFSET.
PRIVATE_OFFSET = 200


def _private_layout(root: Path) -> Layout:
    return Layout.from_env().shifted(PRIVATE_OFFSET, root)


def _ports(layout: Layout) -> list[int]:
    return [
        layout.postgres.port,
        layout.kafka.broker,
        layout.kafka.controller,
        *layout.s3.all().values(),
        layout.moto.port,
    ]


def _faults_ports(layout: Layout) -> list[int]:
    faults, proxies = layout.faults, layout.toxiproxy
    return [
        faults.postgres,
        faults.kafka,
        faults.kafka_controller,
        faults.kafka_external,
        proxies.api,
        proxies.postgres,
        proxies.kafka,
    ]


def _connect_ports(layout: Layout) -> list[int]:
    return [layout.connect.port, layout.connect.killable]


def _standby_ports(layout: Layout) -> list[int]:
    pair = layout.postgres_standby
    return [pair.primary, pair.standby, pair.alone]


def _all_ports(layout: Layout) -> list[int]:
    return [
        *_ports(layout),
        *_faults_ports(layout),
        *_connect_ports(layout),
        *_standby_ports(layout),
    ]


def test_no_two_servers_share_a_port() -> None:
    """The main bed, the faults bed, Toxiproxy, the Spark Connect servers, the Postgres
    primary and standby, the private beds these tests start (+200) and the SeaweedFS
    test_s3.py restarts (+400) all run at once: with this environment's ports, no port may
    be wanted twice."""
    shared = Layout.from_env()
    ports = (
        _all_ports(shared)
        + _all_ports(_private_layout(shared.root / "private"))
        + list(shared.shifted(RESTART_OFFSET, shared.root / "restart").s3.all().values())
    )
    doubled = sorted({p for p in ports if ports.count(p) > 1})
    assert doubled == [], f"ports wanted by two servers: {doubled}"


def _pids(testbed: Testbed, names: tuple[str, ...] = SERVERS) -> dict[str, int | None]:
    return {s.name: s.status().pid for s in testbed.select(names)}


@pytest.fixture
def private_testbed(tmp_path: Path) -> Iterator[Testbed]:
    testbed = Testbed.create(_private_layout(tmp_path / "services"))
    try:
        yield testbed
    finally:
        for service in testbed.select(SERVERS):
            service.reset()


def test_up_twice_is_harmless_and_down_leaves_nothing(private_testbed: Testbed) -> None:
    up(SERVERS, private_testbed)
    first = _pids(private_testbed)
    assert all(first.values()), first
    groups = {name: group_members(pid) for name, pid in first.items() if pid}

    started = time.monotonic()
    up(SERVERS, private_testbed)
    assert time.monotonic() - started < 15, "a second `up` should only check health"
    assert _pids(private_testbed) == first
    assert all(s.status().running for s in private_testbed.select(SERVERS))

    down(SERVERS, private_testbed)
    assert _pids(private_testbed) == dict.fromkeys(SERVERS)
    leftovers = {name: [p for p in pids if pid_alive(p)] for name, pids in groups.items()}
    assert leftovers == {name: [] for name in groups}, leftovers
    taken = [p for p in _ports(private_testbed.layout) if not port_is_free(p)]
    sockets = subprocess.run(["ss", "-tanp"], capture_output=True, text=True, check=False)
    held = [line for line in sockets.stdout.splitlines() if any(f":{p} " in line for p in taken)]
    assert taken == [], f"ports still held after down: {taken}\n" + "\n".join(held)

    down(SERVERS, private_testbed)  # down twice is harmless too


def test_moto_starts_with_its_bucket_authorization_on_and_nothing_kept(tmp_path: Path) -> None:
    """moto's `up` leaves a bucket, an admin key in a 0600 file and IAM enforced (a wrongly
    signed request is refused); it keeps everything in memory, so after down and up the old
    key and the old objects are gone and a new key works."""
    from botocore.exceptions import ClientError

    testbed = Testbed.create(_private_layout(tmp_path / "services"))
    moto = testbed.moto
    try:
        up(["moto"], testbed)
        assert moto.credentials_file.stat().st_mode & 0o777 == 0o600
        first = moto.endpoint()
        first.client().put_object(Bucket=first.bucket, Key="k", Body=b"v")
        forged = dataclasses.replace(first, secret_access_key="wrong")
        with pytest.raises(ClientError) as refused:
            forged.client().get_object(Bucket=first.bucket, Key="k")
        assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"

        down(["moto"], testbed)
        assert moto.pid() is None
        up(["moto"], testbed)
        second = moto.endpoint()
        assert second.access_key_id != first.access_key_id
        assert second.client().list_objects_v2(Bucket=second.bucket).get("KeyCount") == 0
        with pytest.raises(ClientError) as forgotten:
            first.client().head_bucket(Bucket=first.bucket)
        assert forgotten.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    finally:
        moto.reset()


@pytest.mark.fault_tier  # the default suite starts the faults bed and its tests restart it
def test_faults_bed_up_twice_is_harmless_and_down_leaves_nothing(tmp_path: Path) -> None:
    testbed = Testbed.create(_private_layout(tmp_path / "services"))
    try:
        up(["faults"], testbed)
        first = _pids(testbed, FAULTS)
        assert all(first.values()), first
        groups = {name: group_members(pid) for name, pid in first.items() if pid}
        # The proxies exist, point at this bed's servers, and carry no toxic.
        proxies = testbed.toxiproxy.api.proxies()
        assert {p.upstream for p in proxies.values()} == {
            f"127.0.0.1:{testbed.layout.faults.postgres}",
            f"127.0.0.1:{testbed.layout.faults.kafka_external}",
            f"127.0.0.1:{testbed.layout.s3.s3}",
        }

        up(["faults"], testbed)
        assert _pids(testbed, FAULTS) == first

        down(["faults"], testbed)
        assert _pids(testbed, FAULTS) == dict.fromkeys(FAULTS)
        leftovers = {name: [p for p in pids if pid_alive(p)] for name, pids in groups.items()}
        assert leftovers == {name: [] for name in groups}, leftovers
        taken = [p for p in _faults_ports(testbed.layout) if not port_is_free(p)]
        assert taken == [], f"ports still held after down: {taken}"
        down(["faults"], testbed)
    finally:
        for service in testbed.select(["faults"]):
            service.reset()


@contextlib.contextmanager
def _squat(port: int) -> Iterator[None]:
    """Listen on port as a foreign process would (earlier tests may leave TIME_WAIT)."""
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        yield


@pytest.mark.parametrize("server", SERVERS)
def test_taken_port_is_named_in_the_error(tmp_path: Path, server: str) -> None:
    layout = _private_layout(tmp_path / "services")
    port = {
        "postgres": layout.postgres.port,
        "kafka": layout.kafka.broker,
        "s3": layout.s3.s3,
        "moto": layout.moto.port,
    }[server]
    with _squat(port), pytest.raises(ServiceError) as raised:
        up([server], Testbed.create(layout))
    message = str(raised.value)
    assert f"port {port}" in message
    assert "already in use" in message
    assert "DS_" in message  # names the way out


def test_unreachable_server_fails_the_test_instead_of_skipping(tmp_path: Path) -> None:
    layout = _private_layout(tmp_path / "services")
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        textwrap.dedent("""
        def test_needs_postgres(postgres):
            raise AssertionError("must not run without its server")
    """)
    )
    with _squat(layout.postgres.port):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-p",
                "tests.conftest",
                "-q",
                "-rA",
                "-c",
                str(REPO_ROOT / "pyproject.toml"),
                str(probe),
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={
                **os.environ,
                "DS_SERVICES_DIR": str(layout.root),
                "DS_PG_PORT": str(layout.postgres.port),
            },
        )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "1 error" in output, output
    assert "skipped" not in output, output
    assert f"port {layout.postgres.port}" in output, output
