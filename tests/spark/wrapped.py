"""A sink wrapped for a Spark test: the real sink, unchanged, with the part it writes known,
for subclasses that act at a moment of the plan's choosing (crash_child, cluster_child)."""

from __future__ import annotations

from typing import Any

from durable_sinks.core import OpenContext, SinkConnector
from durable_sinks.core.errors import UsageError


class WrappedSink:
    """Delegates everything to `inner`; remembers the task's part name (`p<partition>-t<task
    attempt id>`) from `open`.

    The inner sink's public members are copied onto the wrapper, not only reached through
    `__getattr__`: from Python 3.12 `isinstance` against a runtime-checkable protocol
    (DistributedSink, PublishingSink) looks members up statically and would not see them."""

    def __init__(self, inner: SinkConnector, plan: dict[str, Any]) -> None:
        self._inner = inner
        self._plan = plan
        self._part = ""  # until open()
        for name in dir(inner):
            if name.startswith("_") or hasattr(type(self), name):
                continue
            try:
                setattr(self, name, getattr(inner, name))
            except UsageError:
                continue  # a property readable only once open (`context`): via __getattr__

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def open(self, context: OpenContext) -> None:
        self._part = context.part
        self._inner.open(context)
