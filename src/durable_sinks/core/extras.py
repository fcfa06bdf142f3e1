"""The optional client libraries: which extra of durable-sinks installs each sink's and
decision store's client, and the one check that turns a missing client into a ConfigError
naming the extra to install.

The base install holds what every job needs (pyspark with its `sql` extra, which brings the
pandas its Arrow paths check for; pyarrow, numpy, ...); each sink's client comes with its
extra (`pip install 'durable-sinks[kafka]'`; each kind's extra is named by the registry,
durable_sinks.sinks.built_in(); or `[all]`). A sink or decision store asks
for its extra when it is built, before anything is written: `require_extra("kafka", "the
kafka sink")` imports the client modules and raises ConfigError if one is not installed.
Only a module of that extra that is missing is converted: any other import error (a broken
install, a missing dependency of the client itself) is raised as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module

from .errors import ConfigError

#: Each extra and the modules durable-sinks imports from the distributions it installs
#: (module -> the distribution to name in a message), as pyproject.toml declares them.
EXTRAS: dict[str, dict[str, str]] = {
    "postgres": {"psycopg": "psycopg[binary]", "pgpq": "pgpq"},
    "kafka": {"confluent_kafka": "confluent-kafka", "orjson": "orjson"},
    "s3": {"boto3": "boto3", "botocore": "botocore, installed with boto3"},
    "delta": {"deltalake": "deltalake"},
    "iceberg": {"pyiceberg": "pyiceberg[pyarrow]"},
}


def install_command(extra: str) -> str:
    """The pip command that installs `extra`."""
    return f"pip install 'durable-sinks[{extra}]'"


def missing_client(error: ModuleNotFoundError, extra: str) -> str | None:
    """The module of `extra` whose absence `error` reports (the module itself or one of its
    submodules, such as `confluent_kafka.admin`), else None."""
    name = error.name
    if not name:
        return None
    for module in EXTRAS[extra]:
        if name == module or name.startswith(module + "."):
            return module
    return None


@contextmanager
def needs_extra(extra: str, what: str, *, job: str | None = None) -> Iterator[None]:
    """Inside the block, a ModuleNotFoundError for one of `extra`'s modules becomes a
    ConfigError saying that `what` (e.g. "the kafka sink") needs it and how to install it;
    every other error passes through unchanged."""
    if extra not in EXTRAS:
        raise ValueError(f"no extra named {extra!r}; known: {', '.join(sorted(EXTRAS))}")
    try:
        yield
    except ModuleNotFoundError as exc:
        module = missing_client(exc, extra)
        if module is None:
            raise
        raise ConfigError(
            f"{what} needs the {module} module ({EXTRAS[extra][module]}), which is not "
            f"installed in this Python ({exc})",
            job=job,
            fix=f"{install_command(extra)} (or 'durable-sinks[all]') where the job runs: "
            "the driver, and in executor mode Spark's Python workers",
        ) from exc


def require_extra(extra: str, what: str, *, job: str | None = None) -> None:
    """ConfigError (see `needs_extra`) unless every module of `extra` imports. A module that
    loads its client lazily is checked here all the same, before anything is written."""
    with needs_extra(extra, what, job=job):
        for module in EXTRAS[extra]:
            import_module(module)
