"""How a writer travels to where Spark Connect runs `foreachBatch`.

Under Spark Connect the client pickles the function given to `foreachBatch` (with cloudpickle)
and the Connect server unpickles it in a Python process of its own. A writer pickled plainly
(by reference to its class) would fail there, before any batch, with a bare
`ModuleNotFoundError` when that Python lacks durable-sinks, or could run another version's code
on this version's configuration. So a writer pickles as a call to `restore`, a function
shipped by value (cloudpickle pickles a nested function's code), with the client's version
and the writer pickled as bytes. On the server `restore` checks the installed version first;
when it is missing or of another release line (MAJOR.MINOR: patch releases of one line run
together, core/formats.py `interoperate`), it returns a function that raises, at the first
batch and before anything is written, an error naming both versions and the fix.

The copy starts with no coordinator: its first batch starts one (fencing the client's check
and any older driver, recovering leftovers) from the configuration alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Where the error tells the user to look.
GUIDE = "docs/guide.md, 'Spark Connect'"


def shipped(obj: Any, version: str, job: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """`obj.__reduce__()` for an object that must be restored by `restore` (see module)."""
    from pyspark import cloudpickle

    payload: bytes = cloudpickle.dumps((type(obj), obj.__getstate__()))  # type: ignore[no-untyped-call]
    return _restorer(), (version, job, payload, GUIDE)


def _restorer() -> Callable[[str, str, bytes, str], Any]:
    """The function that rebuilds a shipped object. Nested: cloudpickle ships its code by
    value, so that unpickling it imports nothing of durable-sinks."""

    def restore(version: str, job: str, payload: bytes, guide: str) -> Any:
        import pickle
        import re
        import sys

        try:
            import durable_sinks

            found: str | None = durable_sinks.__version__
        except ImportError:
            found = None

        def line(release: str) -> str:
            # core/formats.py `release_line`, repeated: this code runs before (and without)
            # the server's durable-sinks.
            matched = re.match(r"^(\d+)\.(\d+)(?:\.|$)", release)
            return f"{matched[1]}.{matched[2]}" if matched else release

        if found is None or line(found) != line(version):
            have = "does not have durable-sinks" if found is None else f"has durable-sinks {found}"
            message = (
                f"the Python that runs foreachBatch on the Spark Connect server "
                f"({sys.executable}) {have}; the client that started the query has {version}, "
                f"which runs only with releases {line(version)}.x. Nothing was written."
            )
            fix = (
                f"install durable-sinks=={version} (or another {line(version)}.x release, "
                "with its dependencies) into the Python the Connect server runs Python "
                "functions with (its PYSPARK_PYTHON, or spark.pyspark.python) and into its "
                f"executors' Python; see {guide}"
            )

            def refuse(df: Any, batch_id: int) -> None:
                if found is None:
                    raise RuntimeError(f"[job={job}, epoch={batch_id}] {message} Fix: {fix}")
                from durable_sinks.core.errors import ConfigError

                raise ConfigError(message, job=job, epoch=int(batch_id), fix=fix)

            return refuse
        cls, state = pickle.loads(payload)  # noqa: S301 - pickled by this query's own client
        obj = cls.__new__(cls)
        obj.__setstate__(state)
        return obj

    return restore
