"""What the Delta sink checks before a job writes: the table fits the sink's settings, and
the store can take Delta commits safely (a new log version is created only if absent: on S3
that is a conditional write, `If-None-Match: *`, which delta-rs uses without an external
lock; a server that ignores it would let two writers both write version N)."""

from __future__ import annotations

from durable_sinks.clients.s3 import conditional_write_problem
from durable_sinks.core.errors import ConfigError

from .config import Delta
from .layout import ROOT
from .snapshot import LogSnapshot
from .storage import TableStorage

#: delta-rs's storage options that name an external commit lock instead of conditional writes.
LOCKING_OPTIONS = ("AWS_S3_LOCKING_PROVIDER", "aws_s3_locking_provider")


def table_problems(config: Delta, snapshot: LogSnapshot) -> list[str]:
    """Why an existing table cannot take this sink's rows (empty when it can)."""
    shape = snapshot.shape
    problems = []
    if config.partition_by and tuple(config.partition_by) != shape.partition_by:
        problems.append(
            f"partition_by={list(config.partition_by)} but the table is partitioned by "
            f"{list(shape.partition_by)} (partition_by only shapes a table the sink creates)"
        )
    for column in config.key:
        if column not in shape.schema.names:
            problems.append(f"key column {column!r} is not a column of the table")
    if snapshot.min_writer_version > 7 or snapshot.min_reader_version > 3:
        problems.append(
            f"the table needs writer version {snapshot.min_writer_version}, beyond delta-rs's"
        )
    return problems


def check_store(config: Delta, storage: TableStorage) -> None:
    """ConfigError (with the fix) when the store cannot hold the table safely; the probe
    objects are deleted again."""
    probe = f"{ROOT}/probe-{id(storage):x}"
    storage.write_bytes(probe, b"1")
    storage.delete([probe])
    if not config.on_s3:
        return
    if any(option in (config.storage_options or {}) for option in LOCKING_OPTIONS):
        return  # the user chose delta-rs's external lock
    location = config.location
    problem = conditional_write_problem(
        config.connection.client(), location.bucket, location.key(ROOT) + "/"
    )
    if problem is not None:
        raise ConfigError(
            f"the S3 server at {config.connection.server()} cannot take Delta commits safely: "
            f"{problem}",
            sink=config.name,
            fix="use a server that honours If-None-Match: * (AWS S3, MinIO from 2024-11, "
            "SeaweedFS), or give delta-rs an external lock: storage_options="
            "{'AWS_S3_LOCKING_PROVIDER': 'dynamodb', 'DELTA_DYNAMO_TABLE_NAME': ...}",
        )
