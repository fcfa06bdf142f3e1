"""JSON Lines files in a local folder, exactly once: the reference sink.

It is small on purpose and commented as the template a sink author copies
(docs/writing-a-sink.md). Each role of a sink is one module:

- `config`: the options, as a frozen dataclass whose `__post_init__` checks values;
- `layout`: where everything lives in the target (the staging area, the published files);
- `handles`: what a participant's CommitHandle carries, typed, versioned, parsed in one place;
- `writer`: phase 1 (begin, write, prepare): everything durable, nothing visible;
- `committer`: phase 2 (commit or roll back one handle), idempotent, from any process;
- `recovery`: what older generations of the job left, and what the target says is committed;
- `views`: what the `durable-sinks` command shows (in doubt, holdings per epoch);
- `sink`: the protocol's methods, each handing over to one of the roles above.

`KIND` below is what the registry (sinks/_registry.py) builds `durable_sink("jsonl", ...)`
from; a third-party sink exports the same kind of object and names it in an entry point.
"""

from durable_sinks.core.kinds import SinkKind

from .config import Jsonl
from .layout import MARKER, ROWS, STAGING
from .sink import JsonlSink

#: The kind `durable_sink("jsonl", ...)` builds (registered in ../_registry.py).
KIND = SinkKind("jsonl", Jsonl, JsonlSink)

__all__ = ["KIND", "MARKER", "ROWS", "STAGING", "Jsonl", "JsonlSink"]
