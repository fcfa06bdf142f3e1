"""Driver mode's ways of reading a micro-batch as Arrow record batches.

Each yields the batch's rows as record batches cast to `arrow_schema(df)` (the schema
`toArrow()` gives), so that every read hands the sinks the same types.

`socket_batches` (the fast path; classic PySpark only): one Spark job computes the batch once,
its executors turn each partition into Arrow record batches
(`spark.sql.execution.arrow.maxRecordsPerBatch` rows each), and the driver's Python receives
them as the partitions finish, one record batch at a time (handed to the sinks joined into groups
of up to GROUP_ROWS rows: `grouped`). What the driver's JVM holds meanwhile
(finished partitions not read yet) is bounded by `spark.driver.maxResultSize`: a larger batch
fails the job with ResultTooLargeError before anything is decided. It is the only place where
durable-sinks uses a private part of PySpark (the collect-as-Arrow socket `toArrow()` uses,
reached through the DataFrame's JVM object), so it runs only where `socket_read_problem` found
it working: a one-row read through it when `durable_sink(...)` is called.

`partition_batches` (public API only; classic and Spark Connect, every supported version): the
executors turn each partition's record batches into Arrow IPC messages (`mapInArrow`, one binary
value per record batch) and the driver fetches the partitions one at a time
(`toLocalIterator(prefetchPartitions=True)`: the next partition is computed while this one is
written). Nothing is cached and the batch is computed once; the driver holds at most two
partitions. It costs a pass through Spark's Python workers and a copy of each record batch
(docs/benchmarks.md, "How fast are driver mode's reads on each supported pyspark?").

`chunked_batches`: the batch DataFrame is persisted (MEMORY_AND_DISK), its rows are counted per
partition (the job that fills the cache), and whole partitions are then collected in chunks of
at most `max_rows` rows (a larger partition alone). Spark never recomputes the batch while it
is written, and the driver never holds more than one chunk, at the price of the cache (which
serverless Spark refuses). Each chunk's row count is compared with the count taken when the
cache was filled: a difference means Spark recomputed lost partitions and the query is not
deterministic; BatchChangedError is raised before anything can commit.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import contextmanager
from importlib import import_module
from typing import TYPE_CHECKING, Any

from durable_sinks.core.errors import BatchChangedError
from durable_sinks.core.joblog import JobLogger

from ._session import is_connect

if TYPE_CHECKING:
    import pyarrow as pa

#: The column of `partition_batches`' intermediate DataFrame: one Arrow IPC stream per value.
IPC_COLUMN = "arrow_ipc"

#: `grouped`: Spark's consecutive record batches are joined until a group holds this many
#: rows or GROUP_BYTES bytes (driver mode's streamed and partitions reads, where the session
#: leaves RECORDS_PER_BATCH at Spark's default; the chunked read keeps its chunks' bound).
#: Each record batch costs a sink a fixed amount (for Postgres one COPY statement and its
#: round trip: an epoch of 100,000 rows as ten COPYs of 10,000 took 106 ms, as three 83 ms;
#: docs/benchmarks.md, "Does grouping Spark's record batches save the Postgres sink time?"),
#: and Spark sends 10,000 rows per record batch by default. A group is handed on only once
#: complete, so its size is also how long the first write waits for Spark's later record
#: batches: 100,000 rows lost that wait what the fewer COPYs saved, 32,768 did not.
GROUP_ROWS = 32_768
GROUP_BYTES = 16 * 2**20


def plan_chunks(counts: Mapping[int, int], max_rows: int) -> list[list[int]]:
    """Group partition ids (ascending) into consecutive chunks of at most `max_rows` rows; a
    partition with more rows than that forms a chunk of its own. Empty partitions are left
    out."""
    if max_rows < 1:
        raise ValueError("max_rows must be >= 1")
    chunks: list[list[int]] = []
    current: list[int] = []
    held = 0
    for partition in sorted(counts):
        rows = counts[partition]
        if rows <= 0:
            continue
        if current and held + rows > max_rows:
            chunks.append(current)
            current, held = [], 0
        current.append(partition)
        held += rows
    if current:
        chunks.append(current)
    return chunks


class ResultTooLargeError(Exception):
    """The batch did not fit `spark.driver.maxResultSize` when streamed (the job failed); the
    message is Spark's line that says so."""


def is_result_too_large(exc: BaseException) -> bool:
    """True when `exc` is Spark's "total size of serialized results ... is bigger than
    spark.driver.maxResultSize" job failure, however PySpark wrapped it."""
    return "maxResultSize" in str(exc)


def _too_large(exc: BaseException) -> ResultTooLargeError:
    lines = [line.strip() for line in str(exc).splitlines() if "maxResultSize" in line]
    return ResultTooLargeError(lines[0] if lines else str(exc))


def _uses_large_types(df: Any) -> bool:
    conf = df.sparkSession.conf
    return str(conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false")) == "true"


def arrow_schema(df: Any, large: bool | None = None) -> pa.Schema:
    """The Arrow schema `df.toArrow()` gives (timestamps in UTC; large string and binary types
    where `spark.sql.execution.arrow.useLargeVarTypes` is on, a setting pyspark 3.5 lacks).
    `large`: that setting, when the caller has read it already."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(
            df.schema,
            error_on_duplicated_field_names_in_struct=True,
            timezone="UTC",
            prefers_large_types=_uses_large_types(df) if large is None else large,
        )
    except TypeError:  # pyspark 3.5: the schema alone (its timestamps are UTC already)
        return to_arrow_schema(df.schema)


#: The Spark setting of the rows per record batch the executors send.
RECORDS_PER_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"


def group_rows(df: Any) -> int | None:
    """`grouped`'s `rows` for a batch of `df`: None (GROUP_ROWS) under Spark's default record
    batches; 0 (the record batches as they are) when the session sets RECORDS_PER_BATCH,
    whose choice of size then reaches the sinks unchanged."""
    return None if df.sparkSession.conf.get(RECORDS_PER_BATCH, None) is None else 0


def grouped(
    batches: Iterator[pa.RecordBatch], rows: int | None = None, nbytes: int | None = None
) -> Generator[pa.RecordBatch, None, None]:
    """The rows of `batches`, in their order, with consecutive record batches joined (one
    copy of their rows) into groups that reach `rows` rows or `nbytes` bytes; the last group
    may be smaller, and a batch with another schema starts a new group. A group is handed on
    once complete, so a write can start only when its last rows have arrived; besides the
    group being filled, the driver holds one group's copy while joining. `rows` <= 0 hands
    the batches on as they are. Closing this generator closes `batches`. By default `rows`
    and `nbytes` are GROUP_ROWS and GROUP_BYTES."""
    import pyarrow as pa

    rows = GROUP_ROWS if rows is None else rows
    nbytes = GROUP_BYTES if nbytes is None else nbytes
    held: list[pa.RecordBatch] = []

    def taken() -> pa.RecordBatch:
        """The held batches as one group; none held afterwards."""
        group = held[0] if len(held) == 1 else pa.concat_batches(held)
        held.clear()
        return group

    try:
        if rows <= 0:
            yield from batches
            return
        for batch in batches:
            if held and batch.schema != held[0].schema:
                yield taken()
            held.append(batch)
            if sum(b.num_rows for b in held) >= rows or sum(b.nbytes for b in held) >= nbytes:
                yield taken()
        if held:
            yield taken()
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def _conformed(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    return batch if batch.schema == schema else batch.cast(schema)


def socket_batches(
    df: Any, *, job: str, epoch: int | None = None
) -> Generator[pa.RecordBatch, None, None]:
    """The rows of `df` through the fast path of the module docstring, in the order its
    partitions finish. Raises ResultTooLargeError (chained to Spark's error) when the batch
    exceeds `spark.driver.maxResultSize`; closing the iterator early ends the job's stream."""
    import pyarrow as pa
    from pyspark.errors.exceptions.captured import unwrap_spark_exception
    from pyspark.sql.pandas.serializers import ArrowCollectSerializer

    # pyspark 4: pyspark.util's, a context manager; pyspark 3.5: pyspark.rdd's, an iterator.
    load_from_socket = getattr(import_module("pyspark.util"), "_load_from_socket", None)
    if load_from_socket is None:
        load_from_socket = import_module("pyspark.rdd")._load_from_socket

    schema = arrow_schema(df)
    port, secret, server = df._jdf.collectAsArrowToPython()
    finished = False
    try:
        serializer = ArrowCollectSerializer()  # type: ignore[no-untyped-call]
        opened = load_from_socket((port, secret), serializer)
        with _socket_stream(opened) as stream:
            for item in stream:
                if isinstance(item, pa.RecordBatch):  # (the last item: the batches' order)
                    yield _conformed(item, schema)
        finished = True
    except Exception as exc:
        if is_result_too_large(exc):
            raise _too_large(exc) from exc
        raise
    finally:
        try:
            with unwrap_spark_exception():
                server.getResult()  # joins the serving thread; raises the job's error
        except Exception as exc:
            if not finished:  # an error is on its way out already; this one follows from it
                log = JobLogger(job, epoch=epoch, component="spark")
                log.debug("the collect job ended with: %s", exc)
            elif is_result_too_large(exc):
                raise _too_large(exc) from exc
            else:
                raise


@contextmanager
def _socket_stream(opened: Any) -> Iterator[Iterator[Any]]:
    """What `_load_from_socket` returns, as a context manager: pyspark 4's is one already;
    pyspark 3.5's plain iterator is closed (with its socket file) on leaving."""
    if hasattr(opened, "__enter__"):
        with opened as stream:
            yield stream
        return
    try:
        yield iter(opened)
    finally:
        if hasattr(opened, "close"):
            opened.close()


def _ipc_encoder(large: bool) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function `mapInArrow` runs on the executors: each non-empty record batch becomes one
    row holding it as an Arrow IPC stream. Defined here, inside a function, so that cloudpickle
    ships it by value: the executors need pyarrow, not durable-sinks."""

    def encode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        kind = pa.large_binary() if large else pa.binary()
        for batch in batches:
            if batch.num_rows == 0:
                continue
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
            value = pa.array([sink.getvalue().to_pybytes()], type=kind)
            yield pa.RecordBatch.from_arrays([value], names=[IPC_COLUMN])

    return encode


def partition_batches(df: Any) -> Generator[pa.RecordBatch, None, None]:
    """The rows of `df` through Spark's public API, partition by partition, as described in the
    module docstring. Works in classic PySpark and under Spark Connect; caches nothing."""
    import pyarrow as pa

    large = _uses_large_types(df)  # (a round trip to the server under Spark Connect)
    schema = arrow_schema(df, large)
    encoded = df.mapInArrow(_ipc_encoder(large), f"{IPC_COLUMN} binary")
    for row in encoded.toLocalIterator(prefetchPartitions=True):
        with pa.ipc.open_stream(pa.py_buffer(row[0])) as reader:
            for batch in reader:
                yield _conformed(batch, schema)


def table_of(df: Any) -> pa.Table:
    """All of `df` as one Arrow table: `toArrow()` where PySpark has it (4.0 and later), the
    partitions read otherwise."""
    import pyarrow as pa

    if hasattr(df, "toArrow"):
        table: pa.Table = df.toArrow()
        return table
    return pa.Table.from_batches(list(partition_batches(df)), schema=arrow_schema(df))


def chunked_batches(
    df: Any, max_rows: int, *, job: str | None = None, epoch: int | None = None
) -> Generator[pa.RecordBatch, None, None]:
    """The rows of `df` as record batches, read as described in the module docstring. Persists
    `df` only once iterated; unpersists it when the iterator ends or is closed."""
    from pyspark import StorageLevel
    from pyspark.sql.functions import spark_partition_id

    df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        partition = spark_partition_id()
        counts = {
            int(row[0]): int(row[1]) for row in df.groupBy(partition.alias("p")).count().collect()
        }
        chunks = plan_chunks(counts, max_rows)
        for chunk in chunks:
            expected = sum(counts[p] for p in chunk)
            part = df if len(chunks) == 1 else df.where(partition.isin(chunk))
            table = table_of(part)
            if table.num_rows != expected:
                raise BatchChangedError(
                    f"partitions {chunk[0]}..{chunk[-1]} of the batch gave {table.num_rows} "
                    f"rows, {expected} when first read: Spark recomputed them and the query is "
                    "not deterministic",
                    job=job,
                    epoch=epoch,
                    fix="make the query deterministic (no rand(), uuid(), current_timestamp() or "
                    "unordered limits before the sink), or give the driver and executors "
                    "enough memory/disk that cached batches are not lost",
                )
            yield from table.to_batches()
            del table
    finally:
        df.unpersist()


#: socket_read_problem's verdict per Spark application (the probe runs once per driver).
_probed: dict[str, str | None] = {}


def socket_read_problem(spark: Any) -> str | None:
    """Why the fast path cannot serve `spark` (a SparkSession), or None when it can: Spark
    Connect has no JVM object to reach; in classic PySpark three rows are read through it (a
    one-task job, once per Spark application) and any error or wrong count is the reason."""
    if is_connect(spark):
        return "Spark Connect has no collect-as-Arrow socket to the driver's JVM"
    application = str(spark.sparkContext.applicationId)
    if application not in _probed:
        _probed[application] = _probe(spark)
    return _probed[application]


def _probe(spark: Any) -> str | None:
    try:
        probe = spark.range(0, 3, 1, 1)
        rows = sum(batch.num_rows for batch in socket_batches(probe, job="probe"))
    except Exception as exc:  # noqa: BLE001 - any failure means: use the public path
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{type(exc).__name__}: {first}"
    return None if rows == 3 else f"the probe read {rows} of 3 rows"
