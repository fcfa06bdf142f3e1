"""A second, independent S3 implementation: moto's server (PyPI `moto[server]`, a dev extra).

The S3 sink's conformance runs against SeaweedFS and against this, so that it relies on S3's
semantics rather than one server's quirks (docs/testbed.md lists where the two differ).

moto keeps everything in memory: a restart loses every object, upload, user and the bucket
(`up` makes the bucket again), so no test may restart it expecting data back. It enforces IAM
like AWS once told to: `up` starts it with authorization off, creates through moto's own IAM
API an admin user allowed every action, its access key and the bucket, then switches
authorization on for every later request (`POST /moto-api/reset-auth` with 0). From then on
requests must be SigV4-signed by a known access key and each S3 action is checked against
the user's policies, which is what the restricted credentials of tests/support/s3_access.py
build on. moto generates access keys itself, so the admin's are written to
`<root>/moto/credentials.json` (0600) on every start rather than generated once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from ._layout import Layout
from ._process import (
    ServiceError,
    file_lock,
    port_accepts,
    require_free_ports,
    start_daemon,
    wait_until,
)
from ._service import Daemon
from .endpoints import S3Endpoint

NAME = "moto"
REGION = "us-east-1"
BUCKET = "durable-sinks-test"  # the same name as SeaweedFS's, so tests can swap servers
ADMIN_USER = "testbed-admin"
START_TIMEOUT = 60.0
#: werkzeug logs every request at INFO, and the bed's suites make hundreds of thousands: only
#: warnings and errors (tracebacks of 500s included) reach the log, after one line at start.
_LAUNCH = (
    "import logging, sys, moto; logging.getLogger('werkzeug').setLevel(logging.WARNING); "
    "print(f'moto {moto.__version__} on port {sys.argv[-1]}; requests are not logged, "
    "errors are', flush=True); "
    "from moto.server import main; main(sys.argv[1:])"
)
_EVERYTHING = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
}


class Moto(Daemon):
    name = NAME
    stop_timeout = 10.0

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.home = layout.service_dir(NAME)
        self.log = self.home / "moto.log"
        self.pid_file = self.home / "moto.pid"
        self.credentials_file = self.home / "credentials.json"
        self.url = f"http://127.0.0.1:{layout.moto.port}"

    def endpoint(self) -> S3Endpoint:
        """The admin's endpoint: allowed every action."""
        creds = self._credentials()
        return S3Endpoint(
            self.url, REGION, creds["access_key_id"], creds["secret_access_key"], BUCKET
        )

    def up(self) -> None:
        # Two pytest-xdist workers may call up() at once; the second must not start a second
        # server nor bootstrap the first one again.
        with self._exclusive():
            if self.pid() is None:
                require_free_ports(NAME, self.ports())
                self._start()
                wait_until(
                    NAME,
                    self._answers,
                    timeout=START_TIMEOUT,
                    what="the server to answer",
                    log=self.log,
                    alive=lambda: self.pid() is not None,
                )
                self._bootstrap()
            elif not self.credentials_file.exists():
                raise ServiceError(
                    NAME,
                    f"the server runs (pid {self.pid()}) but {self.credentials_file} is "
                    "missing, so no request can be signed. moto keeps no data worth keeping: "
                    "`python -m tests.services down moto` and `up moto` again.",
                )
            wait_until(
                NAME,
                self.ready,
                timeout=START_TIMEOUT,
                what="a signed HeadBucket with the admin's credentials to succeed",
                log=self.log,
                alive=lambda: self.pid() is not None,
            )

    def _exclusive(self) -> contextlib.AbstractContextManager[None]:
        return file_lock(self.home / "up.lock")

    def _start(self) -> None:
        if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
            raise ServiceError(
                NAME,
                "moto's server is not installed: install the dev extras "
                "(`pip install -e '.[dev]'`, which brings moto[server])",
            )
        # A stale file from an earlier server must never sign requests for this one.
        self.credentials_file.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))}
        env.pop("INITIAL_NO_AUTH_ACTION_COUNT", None)
        start_daemon(
            [
                sys.executable,
                "-c",
                _LAUNCH,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.layout.moto.port),
            ],
            log=self.log,
            pid_file=self.pid_file,
            env=env,
            cwd=self.home,
        )

    def _answers(self) -> bool:
        """Whether the server answers HTTP at all (before any credentials exist)."""
        if not port_accepts(self.layout.moto.port):
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=5) as reply:  # noqa: S310
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _bootstrap(self) -> None:
        """With authorization still off: the admin user, its key and the bucket; then
        authorization on, for every request from here."""
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        # Any key works while authorization is off.
        session = boto3.session.Session(
            aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap", region_name=REGION
        )
        try:
            iam = session.client("iam", endpoint_url=self.url)
            iam.create_user(UserName=ADMIN_USER)
            iam.put_user_policy(
                UserName=ADMIN_USER,
                PolicyName="everything",
                PolicyDocument=json.dumps(_EVERYTHING),
            )
            key = iam.create_access_key(UserName=ADMIN_USER)["AccessKey"]
            session.client("s3", endpoint_url=self.url).create_bucket(Bucket=BUCKET)
        except (BotoCoreError, ClientError) as exc:
            raise ServiceError(
                NAME, f"could not set up the admin user: {exc}", log=self.log
            ) from exc
        self._authorize_every_request()
        # Written last: a server whose set-up did not finish has no credentials file, and
        # `up` says so instead of signing requests that nothing checks.
        self._write_credentials(
            {"access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"]}
        )

    def _authorize_every_request(self) -> None:
        request = urllib.request.Request(  # noqa: S310 (a fixed http URL)
            f"{self.url}/moto-api/reset-auth",
            data=b"0",  # authorize every request after this one
            headers={"Content-Type": "text/plain"},  # form-encoded bodies reach moto empty
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310
                answer = json.loads(reply.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ServiceError(
                NAME, f"could not switch authorization on: {exc}", log=self.log
            ) from exc
        if answer.get("status") != "ok":
            raise ServiceError(NAME, f"could not switch authorization on: {answer}", log=self.log)

    def ready(self) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.endpoint().client().head_bucket(Bucket=BUCKET)
        except (BotoCoreError, ClientError, ServiceError):
            return False
        return True

    def ports(self) -> dict[str, int]:
        return {"s3": self.layout.moto.port}

    def describe(self) -> str:
        return f"{self.url} bucket {BUCKET} (in memory)"

    def log_files(self) -> tuple[Path, ...]:
        return (self.log,)

    def _credentials(self) -> dict[str, str]:
        try:
            loaded: dict[str, str] = json.loads(self.credentials_file.read_text())
        except FileNotFoundError:
            raise ServiceError(
                NAME, f"{self.credentials_file} is missing: run `python -m tests.services up moto`"
            ) from None
        return loaded

    def _write_credentials(self, creds: dict[str, str]) -> None:
        staging = self.credentials_file.with_suffix(f".tmp{os.getpid()}")
        staging.unlink(missing_ok=True)
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(creds, f)
        staging.replace(self.credentials_file)
