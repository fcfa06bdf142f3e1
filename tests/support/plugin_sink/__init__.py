"""A third-party sink kind, installed the way a separate distribution installs it: through
the entry-point group `durable_sinks.sinks`, found by `importlib.metadata` in the
`*.dist-info` folders under `dists/` once that folder is on `sys.path` (the `plugin_dists`
fixture of tests/conftest.py).

`dists/` holds two distributions:

- `ds-test-ledger` registers `ledger` (a SinkKind: option checking like a built-in kind) and
  `ledger_bare` (the bare-callable form: options passed through unchecked);
- `ds-test-broken-plugins` registers `broken_import` (its module does not import),
  `not_a_kind` (an object that is neither a SinkKind nor callable) and `misnamed` (a
  SinkKind of another name).

The ledger sink is written as a sink author outside durable-sinks writes one: its own
configuration class, whose fields are its options, and a build function. It stores each epoch
as JSON Lines through the reference sink's roles (`durable_sinks.sinks.folder`, the template
the writing-a-sink guide starts from).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_sinks.core import SinkConnector, SinkKind
from durable_sinks.core.errors import ConfigError
from durable_sinks.sinks.folder import FolderSink, Jsonl

#: The folder to put on `sys.path` for `importlib.metadata` to find the two distributions.
DISTS = Path(__file__).parent / "dists"


@dataclass(frozen=True)
class LedgerConfig:
    """The ledger sink's options.

    - folder: absolute path of the ledger's folder.
    - name: the sink's name within the job.
    - durable: fsync every file (off: exactly-once across process crashes only).
    """

    folder: str
    name: str = "ledger"
    durable: bool = True

    def __post_init__(self) -> None:
        if not os.path.isabs(self.folder):
            raise ConfigError(
                f"ledger sink: folder {self.folder!r} is not an absolute path",
                sink=self.name,
                fix="give the ledger's folder as an absolute path",
            )


def build_ledger(config: LedgerConfig) -> SinkConnector:
    """A ledger sink: JSON Lines files in `config.folder`."""
    return FolderSink(Jsonl(path=config.folder, name=config.name, fsync=config.durable))


KIND = SinkKind("ledger", LedgerConfig, build_ledger)


def bare_ledger(config: Mapping[str, Any]) -> SinkConnector:
    """The bare-callable form: it sees the options exactly as the user gave them."""
    return FolderSink(Jsonl(path=os.fspath(config["folder"]), name="ledger_bare"))


#: Neither a SinkKind nor callable: what a broken entry point may name.
NOT_A_KIND = "a string"
