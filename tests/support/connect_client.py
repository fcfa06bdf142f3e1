"""Spark Connect clients for tests, each in a process of its own.

A classic SparkSession (the `spark` fixture: a `local[2]` driver in the test process) and a
Spark Connect session cannot share one Python process (seen with pyspark 4.2, details in
docs/testbed.md, "Spark Connect"):

- with a classic session running, `SparkSession.builder.remote(url).getOrCreate()` raises
  `[SESSION_ALREADY_EXIST]`;
- the first remote session sets `SPARK_CONNECT_MODE_ENABLED=1` in `os.environ` for good
  (`stop()` leaves it): from then on `SparkSession.builder.getOrCreate()` of classic code fails
  with `[CONNECT_URL_NOT_SET]`, `getActiveSession()` returns the remote session, and
  `pyspark.sql.functions` build Connect columns;
- going around the check (`pyspark.sql.connect.session.SparkSession.builder`) opens the remote
  session, but `functions.col(...)` then builds classic columns that the remote DataFrame
  refuses (`TypeError: 'Column' object is not callable`).

pytest-xdist puts Connect and classic tests in the same worker process, so the client always
runs in a child: `ConnectClient(url).run(fn, *args, **kwargs)` starts
`python -m tests.support.connect_client`, which opens `remote_session(url)`, calls
`fn(spark, *args, **kwargs)` and hands back its result. `fn` must be a module-level function
(the child imports it by name); arguments and result travel pickled.

    def count_range(spark: SparkSession, n: int) -> int:
        return spark.range(n).count()

    def test_example(spark_connect: str) -> None:
        assert ConnectClient(spark_connect).run(count_range, 3) == 3

`start(...)` returns the running client (`pid`, `result()`, `kill()`) for tests that break
something while it works. A child starts in ~2 s (pyspark, gRPC and the session).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, Generic, NoReturn, ParamSpec, TypeVar

from tests.services._layout import REPO_ROOT
from tests.services._process import tail

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ConnectClient", "ConnectClientError", "RunningClient", "remote_session"]

P = ParamSpec("P")
R = TypeVar("R")

_CALL = "call.pickle"
_RESULT = "result.pickle"
_LOG = "client.log"
_ERROR = "error.txt"
#: What a remote session leaves in os.environ; a child starts without them either way.
_CONNECT_ENV = ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE")


class ConnectClientError(RuntimeError):
    """The client process failed, hung or was killed; the message holds its output's end."""


def remote_session(url: str) -> SparkSession:
    """`SparkSession.builder.remote(url).getOrCreate()`, in a process of the client's own.

    Refuses in a process that holds a classic session (a test process with the `spark`
    fixture): pyspark would refuse too, less clearly, and the other way round it breaks the
    classic session for the rest of the process.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:
        raise RuntimeError(
            "this process runs a classic SparkSession: a Spark Connect session cannot share "
            "it. Run the client in a child process: tests.support.connect_client.ConnectClient"
        )
    session: SparkSession = SparkSession.builder.remote(url).getOrCreate()
    return session


@dataclass(frozen=True)
class _Call:
    url: str
    module: str
    qualname: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    by_value: tuple[str, ...]
    retry_seconds: float | None


class RunningClient(Generic[R]):
    """A client process started by `ConnectClient.start`."""

    def __init__(self, proc: subprocess.Popen[bytes], folder: Path, timeout: float) -> None:
        self._proc = proc
        self.folder = folder
        self.timeout = timeout

    @property
    def pid(self) -> int:
        """Its pid, also its process group's id."""
        return self._proc.pid

    @property
    def log(self) -> Path:
        """Its stdout and stderr."""
        return self.folder / _LOG

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def running(self) -> bool:
        return self._proc.poll() is None

    def result(self, timeout: float | None = None) -> R:
        """Wait for the client and return what `fn` returned. Raises ConnectClientError,
        with the end of its output, if it raised, hung (then it is killed) or was killed."""
        limit = self.timeout if timeout is None else timeout
        try:
            code = self._proc.wait(limit)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ConnectClientError(
                f"the Spark Connect client (pid {self.pid}) did not finish within "
                f"{limit:.0f} s and was killed\n  log: {self.log}\n{tail(self.log)}"
            ) from None
        if code != 0:
            error = self.folder / _ERROR
            raised = f": {error.read_text(errors='replace')}" if error.exists() else ""
            raise ConnectClientError(
                f"the Spark Connect client (pid {self.pid}) exited with {code}{raised}"
                f"\n  log: {self.log}\n{tail(self.log, 60)}"
            )
        value: R = pickle.loads((self.folder / _RESULT).read_bytes())  # noqa: S301 (our child's)
        shutil.rmtree(self.folder, ignore_errors=True)
        return value

    def kill(self) -> None:
        """SIGKILL the client's process group and reap it (its folder and log stay)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self._proc.wait()


@dataclass(frozen=True)
class ConnectClient:
    """Runs functions of a Spark Connect session in child processes (module docstring).

    `timeout` bounds each run (the child is killed after it); `env` adds to the child's
    environment. Functions and classes of `fn`'s module, and of the modules named in
    `pickle_by_value`, travel to the server by value (foreachBatch functions, UDFs): the
    server imports only installed packages, as a cluster would, not `tests.*`.

    `retry_seconds`: how long the client retries calls the server does not answer (every
    0.5 s). By default pyspark's own policy: at least 10 minutes, so a client whose server
    was killed and not restarted gets its error only after that (and `spark.stop()` at the
    end waits as long again); crash tests set a few seconds.

    Each run gets a folder (its call, result and `client.log`) inside `folder` (default: the
    system's temporary folder), deleted once its result is read; a failed or killed run's
    stays for its log.
    """

    url: str
    timeout: float = 300.0
    env: Mapping[str, str] = field(default_factory=dict)
    pickle_by_value: tuple[str, ...] = ()
    retry_seconds: float | None = None
    folder: Path | None = None

    def run(
        self,
        fn: Callable[Concatenate[SparkSession, P], R],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """`fn(remote_session(url), *args, **kwargs)` in a child process; its result."""
        return self.start(fn, *args, **kwargs).result()

    def start(
        self,
        fn: Callable[Concatenate[SparkSession, P], R],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> RunningClient[R]:
        """Start `fn` in a child process (its own process group) and return at once."""
        module, qualname = getattr(fn, "__module__", ""), getattr(fn, "__qualname__", "")
        if module in ("", "__main__") or "<" in qualname:
            raise ValueError(
                f"{fn!r} is not importable by name: a Spark Connect client runs in a child "
                "process, so give it a function defined at the top level of a module"
            )
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="ds-connect-client-", dir=self.folder))
        call = _Call(
            self.url,
            module,
            qualname,
            args,
            dict(kwargs),
            (module, *self.pickle_by_value),
            self.retry_seconds,
        )
        (folder / _CALL).write_bytes(pickle.dumps(call))
        env = {k: v for k, v in os.environ.items() if k not in _CONNECT_ENV}
        env.update(self.env)
        with (folder / _LOG).open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.connect_client", str(folder)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=env,
                start_new_session=True,
            )
        return RunningClient(proc, folder, self.timeout)


#: How long a test's client retries a Connect server that does not answer: a killed server
#: never comes back on its own, and a live one on loopback answers at once.
GIVE_UP_AFTER_S = 10.0


def exit_without_release(code: int) -> NoReturn:
    """End a client whose Connect server is gone, now. A normal exit releases the session on
    the server, and pyspark retries that (and a second call at exit) for the whole retry
    window each against a dead server (seen: 30 s twice after the report). Output is flushed
    first; a server that is alive drops the session after its idle time-out."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def short_retries(spark: Any, seconds: float = GIVE_UP_AFTER_S) -> None:
    """Make remote session `spark` give up on a server that does not answer after about
    `seconds` (pyspark's default policy retries for ~10 minutes), retrying every 0.5 s."""
    attempts = max(1, math.ceil(seconds / 0.5))
    try:
        from pyspark.sql.connect.client.retries import DefaultPolicy
    except ImportError:  # pyspark 3.5: one policy, a dict the client reads at each call
        spark.client._retry_policy.update(
            max_retries=attempts, initial_backoff=500, backoff_multiplier=1.0, max_backoff=500
        )
        return
    policy = DefaultPolicy(
        max_retries=attempts, initial_backoff=500, backoff_multiplier=1.0, max_backoff=500
    )
    spark.client.set_retry_policies([policy])


def _child(folder: Path) -> int:
    from pyspark import cloudpickle

    call: _Call = pickle.loads((folder / _CALL).read_bytes())  # noqa: S301 (our parent's)
    # What the server cannot import goes by value, as a script's own functions (__main__) do.
    for name in call.by_value:
        module = importlib.import_module(name)
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    target: Any = importlib.import_module(call.module)
    for part in call.qualname.split("."):
        target = getattr(target, part)
    spark = remote_session(call.url)
    if call.retry_seconds is not None:
        short_retries(spark, call.retry_seconds)
    try:
        result = target(spark, *call.args, **call.kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, exit 1
        # The log's end is often the server's JVM stack trace: the error itself goes first.
        summary = "\n".join(str(exc).splitlines()[:5])
        (folder / _ERROR).write_text(f"{type(exc).__name__}: {summary}")
        traceback.print_exc()  # into the log
        exit_without_release(1)  # the server may be the reason: do not wait on it
    spark.stop()
    staging = folder / f"{_RESULT}.tmp"
    staging.write_bytes(pickle.dumps(result))
    staging.replace(folder / _RESULT)
    return 0


if __name__ == "__main__":
    sys.exit(_child(Path(sys.argv[1])))
