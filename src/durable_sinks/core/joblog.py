"""Logging with the job, sink and epoch on every line (shared by the coordinator and sinks)."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

LOGGER_NAME = "durable_sinks"

if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[logging.Logger]
else:  # LoggerAdapter is subscriptable at run time from Python 3.11 only
    _Adapter = logging.LoggerAdapter


class JobLogger(_Adapter):
    """Prefixes every message with `job=… sink=… epoch=…` and puts the same three values in
    the record's `extra` (as `ds_job`, `ds_sink`, `ds_epoch`) for structured handlers."""

    def __init__(
        self,
        job: str,
        sink: str | None = None,
        epoch: int | None = None,
        *,
        component: str = "coordinator",
    ) -> None:
        super().__init__(logging.getLogger(f"{LOGGER_NAME}.{component}"), {})
        self.job, self.sink, self.epoch = job, sink, epoch
        self.component = component

    def bind(self, *, sink: str | None = None, epoch: int | None = None) -> JobLogger:
        return JobLogger(
            self.job,
            sink if sink is not None else self.sink,
            epoch if epoch is not None else self.epoch,
            component=self.component,
        )

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        sink = self.sink or "-"
        epoch = "-" if self.epoch is None else self.epoch
        extra = dict(kwargs.get("extra") or {})
        extra.update(ds_job=self.job, ds_sink=sink, ds_epoch=epoch)
        kwargs["extra"] = extra
        return f"job={self.job} sink={sink} epoch={epoch}: {msg}", kwargs
