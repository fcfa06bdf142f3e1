"""Files in a local folder, exactly once: `files` (Parquet) and `jsonl` (JSON Lines), one
implementation with two encoders, and the reference sink a sink author copies
(docs/writing-a-sink.md).

Each participant writes its rows into `_staging/<participant>/` and fsyncs them (phase 1);
after the job's decision the folder is renamed into place, create-only, as
`epoch=<epoch>/part=<part>/` with its marker `_EPOCH.json` (phase 2). Each role is one module:

- `config`: the options, `Files` and `Jsonl`, frozen dataclasses whose `__post_init__` checks
  values (their field docstrings are the options' reference);
- `handles`: what a participant's CommitHandle carries, typed, versioned, parsed in one place;
- `errors`: what the file system's failures mean (the sink's one translation path);
- `writer`: phase 1 (begin, write, prepare): everything durable, nothing visible;
- `committer`: phase 2 (commit or roll back one handle), idempotent, from any process;
- `recovery`: what older generations of the job left, and what the folder says is committed;
- `operations`: what the `durable-sinks` command shows (in doubt, holdings per epoch);
- `sink`: the protocol's methods, each handing over to one of the roles above;

and helpers of its own: `layout` (where everything lives in the folder), `encoders` (how one
part's rows become files: the only difference between the kinds) and `reader` (reading a
`files` dataset's committed epochs with pyarrow).

`FILES` and `JSONL` below are what the registry (sinks/_registry.py) builds
`durable_sink("files", ...)` and `durable_sink("jsonl", ...)` from; a third-party sink exports
the same kind of object and names it in an entry point.
"""

from durable_sinks.core.kinds import SinkKind

from .config import Files, Jsonl
from .encoders import ROWS
from .layout import MARKER, STAGING
from .reader import committed_dataset, committed_schema
from .sink import FolderSink

#: The kind `durable_sink("files", ...)` builds (registered in ../_registry.py).
FILES = SinkKind("files", Files, FolderSink)
#: The kind `durable_sink("jsonl", ...)` builds (registered in ../_registry.py).
JSONL = SinkKind("jsonl", Jsonl, FolderSink)

__all__ = [
    "FILES",
    "JSONL",
    "MARKER",
    "ROWS",
    "STAGING",
    "Files",
    "FolderSink",
    "Jsonl",
    "committed_dataset",
    "committed_schema",
]
