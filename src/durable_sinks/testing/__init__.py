"""The crash/replay conformance suite: run it against a sink to prove it exactly-once.

    from durable_sinks.testing import Scenario, run_conformance

It needs hypothesis: `pip install 'durable-sinks[testing]'`. See `run_conformance` and
docs/testing.md.
"""

try:
    import hypothesis as _hypothesis  # noqa: F401 - only to say what is missing
except ImportError as exc:  # pragma: no cover - tested in a child process without it
    raise ImportError(
        "durable_sinks.testing (the conformance suite) needs hypothesis, which is not "
        "installed: pip install 'durable-sinks[testing]'",
        name=exc.name,
    ) from exc

from ._machine import ConformanceStats, SinkContractMachine, conformance_settings, run_conformance
from ._scenario import (
    COLUMNS,
    DEAD_LETTER_COLUMNS,
    EPOCH_STEP_KINDS,
    EXAMPLES_ENV,
    RECOVERY_STEP_KINDS,
    SCHEMA,
    BadRows,
    Row,
    Scenario,
    Target,
    epoch_rows,
    step_kind,
    to_batches,
)

__all__ = [
    "COLUMNS",
    "DEAD_LETTER_COLUMNS",
    "EPOCH_STEP_KINDS",
    "EXAMPLES_ENV",
    "RECOVERY_STEP_KINDS",
    "SCHEMA",
    "BadRows",
    "ConformanceStats",
    "Row",
    "Scenario",
    "SinkContractMachine",
    "Target",
    "conformance_settings",
    "epoch_rows",
    "run_conformance",
    "step_kind",
    "to_batches",
]
