"""durable-sinks as a Spark data source: `df.writeStream.format("durable")`.

Through PySpark's Python Data Source API (`DataSourceStreamArrowWriter`), in executor mode:

- `write` runs in each task, on the partition's Arrow batches: it prepares the part in every
  sink (`prepare_part`), named after the partition, the task attempt and a token of the
  attempt (task attempt ids start again in each Spark application), for the job's newest
  generation (read, not claimed), and returns the handles as its commit message;
- `commit(messages, batch_id)` runs on the driver side, in a fresh Python process for each
  batch: it starts a coordinator (a new generation: older ones are fenced, their leftovers
  resolved, the batch's own parts adopted), decides the handles Spark kept, commits them and
  rolls back every other attempt of the batch;
- `abort` starts a coordinator whose recovery rolls back every undecided participant.

Options are strings (Spark's): `kind` and the sink's options, or `sinks` as a JSON list of
objects with a `kind` each; the job options of `durable_sink`. Each is read as the type its
configuration class declares (core.settings.from_strings), a plugin kind's too; the options
of a bare-callable plugin by guessing ("true"/"false", integers, JSON lists/objects).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from durable_sinks import sinks
from durable_sinks.coordinator import OutagePolicy, prepare_part
from durable_sinks.core import CommitHandle, SinkConnector
from durable_sinks.core.errors import ConfigError, InDoubtError, UsageError
from durable_sinks.core.joblog import JobLogger
from durable_sinks.core.settings import from_strings

from ._build import build_coordinator, check_job, decision_store
from ._executor import sink_builder
from ._options import JobOptions, job_option_names
from ._specs import SinkSpec

NAME = "durable"
#: Options Spark itself adds or uses; never passed to sinks.
SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})
_INTEGER = re.compile(r"^-?\d+$")


def _value(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if _INTEGER.match(text):
        return int(text)
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


def parse_options(options: Mapping[str, str]) -> tuple[list[SinkSpec], JobOptions]:
    """The sinks and job options of `format("durable")`'s string options (keys lowercased,
    as Spark passes them). Raises ConfigError naming the option and the fix."""
    raw = {k.lower(): str(v) for k, v in options.items() if k.lower() not in SPARK_OPTIONS}
    kind = raw.pop("kind", None)
    listed = _value(raw.pop("sinks")) if "sinks" in raw else None
    # Each option read as the type its class declares ("true" -> True for a bool, "30" -> 30
    # for an int, "123" stays a string for a string option); a bare-callable plugin's by guessing.
    job_names = set(job_option_names())
    values = from_strings(JobOptions, {k: v for k, v in raw.items() if k in job_names})
    config_class = sinks.config_class_of(kind) if kind is not None else None
    sink_raw = {k: v for k, v in raw.items() if k not in job_names}
    if config_class is not None:
        values.update(from_strings(config_class, sink_raw))
    else:
        values.update({k: _value(v) for k, v in sink_raw.items()})
    asked = values.get("execution", values.get("mode"))
    job, rest = JobOptions.split(values)
    if asked == "driver":
        raise ConfigError(
            "the durable data source always writes from the executors (execution='executor')",
            job=job.job_id,
            fix="drop the execution option, or use foreachBatch(durable_sink(...)) for driver "
            "execution",
        )
    job = replace(job, execution="executor")
    if listed is not None:
        if kind is not None or rest:
            raise ConfigError(
                f"with option `sinks`, options {sorted(rest) or ['kind']} go inside each sink",
                job=job.job_id,
                fix='.option("sinks", \'[{"kind": "postgres", "dsn": "...", "table": "t"}]\')',
            )
        if not isinstance(listed, list) or not all(
            isinstance(s, dict) and isinstance(s.get("kind"), str) for s in listed
        ):
            raise ConfigError(
                "option `sinks` must be a JSON list of objects, each with a `kind`",
                job=job.job_id,
                fix='.option("sinks", \'[{"kind": "postgres", ...}, {"kind": "files", ...}]\')',
            )
        specs = [SinkSpec(s["kind"], {k: v for k, v in s.items() if k != "kind"}) for s in listed]
    elif isinstance(kind, str):
        specs = [SinkSpec(kind, rest)]
    else:
        raise ConfigError(
            "the durable data source needs option `kind` (or `sinks`)",
            job=job.job_id,
            fix='.option("kind", "postgres") and the sink\'s options, e.g. .option("table", "t")',
        )
    return specs, job


@dataclass
class DurableCommitMessage(WriterCommitMessage):
    """One task's prepared participants (handles as JSON) and the query it ran for."""

    handles: list[str]
    query_id: str | None


class DurableStreamWriter(DataSourceStreamArrowWriter):
    """See the module docstring. Pickled to the tasks and to the commit process: it holds
    only configuration."""

    def __init__(self, specs: list[SinkSpec], options: JobOptions) -> None:
        self.specs = specs
        self.options = options

    def _build_sinks(self) -> list[SinkConnector]:
        return sink_builder(self.specs, self.options)()

    def write(self, iterator: Iterator[Any]) -> DurableCommitMessage:
        from pyspark import TaskContext

        task = TaskContext.get()
        if task is None:  # pragma: no cover - Spark always runs write in a task
            raise UsageError("the durable data source's write runs only in Spark tasks")
        batch = task.getLocalProperty("streaming.sql.batchId")
        if batch is None:
            raise UsageError(
                "the durable data source writes streaming queries only",
                job=self.options.job_id,
                fix="use df.writeStream.format('durable'), not df.write",
            )
        epoch = self.options.first_epoch + int(batch)
        # Task attempt ids count from 0 again in each Spark application: a restarted driver's
        # attempt of a batch must not take the name of a part committed before (its marker
        # row would collide), so the name carries a token of this attempt as well.
        part = f"p{task.partitionId()}-t{task.taskAttemptId()}-{uuid.uuid4().hex[:8]}"
        store = decision_store(self.specs, self.options)
        try:
            generation = store.peek_generation(self.options.job_id)
        finally:
            store.close()
        options = self.options
        handles = prepare_part(
            options.job_id,
            generation,
            epoch,
            part,
            self._build_sinks,
            iterator,
            policy=options.write_policy,
            dead_letter=None if options.dead_letter is None else options.dead_letter.name,
            bad_row_cap=options.bad_row_cap,
        )
        query_id = task.getLocalProperty("sql.streaming.queryId")
        return DurableCommitMessage([h.dumps() for h in handles], query_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Decide and commit the parts the tasks prepared. An outage at or after the decision
        (InDoubtError, CommitIncompleteError) is ridden out up to outage_tolerance_s, with a
        new coordinator per attempt that finishes the decided epoch. One before the decision
        is not: the failed attempt rolled the parts back and only Spark can write them again
        (the query fails; its restart replays the batch)."""
        kept = [m for m in messages if isinstance(m, DurableCommitMessage)]
        handles = [CommitHandle.from_json(json.loads(h)) for m in kept for h in m.handles]
        sources = {m.query_id for m in kept if m.query_id is not None}
        source = sources.pop() if len(sources) == 1 else None
        epoch = self.options.first_epoch + batchId

        def attempt() -> None:
            coordinator = build_coordinator(self.specs, self.options, source=source)
            try:
                coordinator.start(adopt={h.participant for h in handles})
                coordinator.run_distributed_epoch(epoch, lambda generation: handles)
            finally:
                coordinator.close()

        OutagePolicy(tolerance_s=self.options.outage_tolerance_s).ride(
            attempt,
            after_failure=lambda _: None,
            log=JobLogger(self.options.job_id, epoch=epoch, component="spark"),
            rides=lambda error: isinstance(error, InDoubtError),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        coordinator = build_coordinator(self.specs, self.options)
        try:
            coordinator.start()  # recovery rolls back every participant nothing decided
        finally:
            coordinator.close()


class DurableDataSource(DataSource):
    """`format("durable")`: exactly-once writes from Spark tasks, decided per batch."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def streamWriter(self, schema: Any, overwrite: bool) -> DurableStreamWriter:  # noqa: N802
        specs, options = parse_options(self.options)
        # Validation (capabilities, servers, settings) and the sinks' tables and fences, when
        # the query starts; the first batch's tasks then prepare for this generation. Spark
        # also calls this in the process that commits each batch, while the batch's parts are
        # prepared: recovery is left to that commit's own coordinator (which adopts them).
        check_job(specs, options)
        return DurableStreamWriter(specs, options)
