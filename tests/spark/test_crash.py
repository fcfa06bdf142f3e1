"""A real Spark driver killed with SIGKILL, restarted from its checkpoint, again and again:
every sink of the job must hold every source row exactly once. Driver mode writes Postgres,
S3, a Delta table, an Iceberg table and Kafka (Kafka is the commit point); executor mode writes
Postgres, S3, a Delta table, an Iceberg table and the files sink from the Spark tasks, with
task attempts that die after preparing (tests/spark/crash_child.py). The Iceberg table (SQL
catalog in the test bed's Postgres, a local warehouse) is read back by pyiceberg and by Spark's
own Iceberg reader (a pyspark 4.1 interpreter, tests/support/iceberg_spark_reader.py); it must
also hold no data file of the job outside its current snapshot, and one commit per epoch. A
lone Kafka sink and a lone Delta table run with no decision_store: the sink keeps the job's
decisions. A Postgres table with a dead-letter table runs in both modes on a stream carrying
rows of every kind the table refuses (tests/spark/bad_rows.py): every row must end in exactly
one of the table or the dead letter.

Each run is a child process (tests/spark/crash_child.py) running a streaming query; a random
plan kills its process group (Python driver and JVM) at one moment: inside `fn` after a
protocol step, after the decision but before Postgres's commit, after `fn` returned but
before Spark's commit log, or during the coordinator's start-up recovery. Then the query is
restarted from the same checkpoint. `DS_SPARK_KILLS` sets how many kills (tests/support/tiers.py:
one per mode and per lone sink by default; the extended run, `make test-crash`, uses 50).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient

from durable_sinks.sinks.folder import STAGING
from tests.conftest import UniqueNames
from tests.services import KafkaEndpoint, PostgresEndpoint, S3Endpoint, Testbed
from tests.support.child_process import start_child
from tests.support.iceberg_spark_reader import read_with_spark
from tests.support.iceberg_target import IcebergCatalog
from tests.support.kafka_reads import read_committed
from tests.support.s3_objects import incomplete_uploads
from tests.support.s3_target import s3_options
from tests.support.targets import create_topic
from tests.support.tiers import SPARK_KILLS

from . import bad_rows
from .streams import (
    delta_epochs,
    delta_ids,
    delta_leftovers,
    iceberg_epochs,
    iceberg_ids,
    iceberg_orphans,
    kafka_ids,
    kafka_open_transactions,
    postgres_ids,
    prepared_transactions,
    published_file_ids,
    s3_committed_ids,
    write_input,
)

KILLS = SPARK_KILLS
#: The source's rows (tests/spark/streams.py's SCHEMA), as the Iceberg table is made.
SOURCE_SCHEMA = pa.schema([("id", pa.int64()), ("body", pa.string())])
ROWS_PER_FILE = 20
ONLY = [p for p in os.environ.get("DS_SPARK_POINTS", "").split(",") if p]
SEED = int(os.environ.get("DS_SPARK_SEED", random.SystemRandom().randrange(10**6)))
#: `cluster`: the drivers' executors run on the test bed's Spark standalone cluster.
TARGET = os.environ.get("DS_SPARK_TARGET", "local")

#: Moments inside one batch (the kill epoch's); PG + Kafka order: postgres first, Kafka last
#: (its commit carries the decision).
IN_BATCH = [
    "step:after-begin:kafka",
    "step:after-write:0:postgres",
    "step:after-write:0:kafka",
    "step:after-pre-commit:postgres",
    "step:after-pre-commit:s3",
    "step:after-pre-commit:delta",
    "step:after-pre-commit:iceberg",  # its data files written, in no snapshot
    "step:after-pre-commit:kafka",
    "step:after-decision",  # Kafka committed, Postgres, S3, Delta and Iceberg still prepared
    "step:after-commit:postgres",
    "step:after-commit:s3",
    "step:after-commit:delta",  # the epoch's Delta commit made, its journals maybe not gone
    "step:after-commit:iceberg",  # its participant taken as prepared, no Iceberg commit yet
    "step:after-finish",  # every sink's epoch published (Iceberg's commit made)
    "after-fn",  # fn returned, Spark's commit log not written yet
]
#: Executor mode (Postgres, files; the decision store is the commit point).
IN_EXECUTOR_BATCH = [
    "step:epoch-start",
    "task:after-prepare",  # a task prepared its part; its handle never reaches the driver
    "step:after-prepare",  # every part prepared, no decision yet
    "step:after-decision",
    "step:after-commit:postgres",
    "step:after-commit:s3",
    "step:after-commit:delta",
    "step:after-commit:iceberg",
    "step:after-commit:files",
    "step:after-finish",
    "step:after-discard:postgres",  # losing attempts of Postgres rolled back, files' not yet
    "step:after-discard:s3",
    "step:after-discard:delta",
    "step:after-discard:iceberg",  # the losing attempts' data files and journal entries gone
    "after-fn",
]
#: Moments of start-up that every restart passes through.
RECOVERY = {
    "driver": [
        "recovery:after-fence",
        "recovery:after-open:postgres",
        "recovery:after-open:s3",
        "recovery:after-open:delta",
        "recovery:after-open:iceberg",
        "recovery:after-open:kafka",
    ],
    "executor": [
        "recovery:after-fence",
        "recovery:after-open:postgres",
        "recovery:after-open:s3",
        "recovery:after-open:delta",
        "recovery:after-open:iceberg",
        "recovery:after-open:files",
    ],
}
#: A lone sink and no decision_store (crash_child's `kafka-alone`, `delta-alone`): the moments
#: of its batches and start-ups. Kafka's commit is the decision (its progress record); the
#: Delta table is decided in its folder's `_decisions`, then committed.
LONE = {
    "kafka-alone": [
        "step:after-begin:kafka",
        "step:after-write:0:kafka",
        "step:after-pre-commit:kafka",
        "step:after-decision",
        "step:after-finish",
        "after-fn",
        "recovery:after-fence",
        "recovery:after-open:kafka",
    ],
    "delta-alone": [
        "step:after-begin:delta",
        "step:after-write:0:delta",
        "step:after-pre-commit:delta",
        "step:after-decision",
        "step:after-commit:delta",
        "step:after-finish",
        "after-fn",
        "recovery:after-fence",
        "recovery:after-open:delta",
    ],
}
#: Kills of a lone sink's job: as many as per mode (DS_SPARK_KILLS raises it).
LONE_KILLS = KILLS
#: A lone Kafka sink routing rows to three topics by their `topic` column (crash_child's
#: `kafka-routed`): the moments of a lone Kafka sink, at least 4 kills.
ROUTED = LONE["kafka-alone"]
ROUTED_KILLS = max(4, KILLS)
#: Postgres and two Kafka topics sharing one transaction (crash_child's `two-kafka`): the
#: first Kafka sink carries the decision, Postgres is prepared before it.
TWO_KAFKA = [
    "step:after-begin:kafka",
    "step:after-write:0:audit",
    "step:after-pre-commit:postgres",
    "step:after-pre-commit:audit",
    "step:after-pre-commit:kafka",
    "step:after-decision",
    "step:after-commit:postgres",
    "after-fn",
    "recovery:after-fence",
    "recovery:after-open:kafka",
    "recovery:after-open:audit",
]
#: The moments of a job writing one Postgres table with a Postgres dead-letter table
#: (on_bad_rows="dead_letter", every batch has dead letters). Driver mode: the table is the
#: commit point (one-phase, its marker holds the decision), the dead letters are prepared
#: before it and committed after. Executor mode: each task prepares its part of both.
BAD_ROWS = {
    "driver": [
        "step:after-begin:postgres",
        "step:after-write:0:postgres",
        "step:after-begin:dead_letters",
        "step:after-write:dead-letters:dead_letters",
        "step:after-pre-commit:dead_letters",
        "step:after-pre-commit:postgres",
        "step:after-decision",  # the table committed with the decision, dead letters prepared
        "step:after-commit:dead_letters",
        "step:after-finish",
        "after-fn",
    ],
    "executor": [
        "step:epoch-start",
        "task:after-prepare",  # a task prepared its part of the table, not its dead letters
        "step:after-prepare",
        "step:after-decision",
        "step:after-commit:postgres",
        "step:after-commit:dead_letters",
        "step:after-finish",
        "step:after-discard:postgres",
        "step:after-discard:dead_letters",
        "after-fn",
    ],
}
BAD_ROWS_RECOVERY = [
    "recovery:after-fence",
    "recovery:after-open:postgres",
    "recovery:after-open:dead_letters",
]
#: In-batch kills that leave a prepared Postgres participant for the next start to resolve.
LEAVE_PREPARED = {
    "step:after-pre-commit:postgres",
    "step:after-pre-commit:dead_letters",
    "step:after-pre-commit:s3",
    "step:after-pre-commit:delta",
    "step:after-pre-commit:iceberg",
    "step:after-pre-commit:kafka",
    "step:after-decision",
    "task:after-prepare",
    "step:after-prepare",
}


def batch_ids(folder: Path) -> set[int]:
    return {int(p.name) for p in folder.glob("[0-9]*")} if folder.exists() else set()


def is_replay(checkpoint: Path) -> bool:
    """Whether the next batch is a replay (offset logged, no commit entry): it may be decided
    already, and then it skips its writes, prepares and decision (no kill point there)."""
    offsets, commits = batch_ids(checkpoint / "offsets"), batch_ids(checkpoint / "commits")
    return bool(offsets) and max(offsets) not in commits


def next_epoch(checkpoint: Path) -> int:
    """The batch the query runs next: the last offset-logged batch if it has no commit entry
    (Spark replays it), else the one after the last committed."""
    offsets, commits = batch_ids(checkpoint / "offsets"), batch_ids(checkpoint / "commits")
    if not offsets:
        return 0
    last = max(offsets)
    return last if last not in commits else last + 1


def run_child(plan: dict[str, object], folder: Path, run: int) -> tuple[int, str]:
    proc, log = start_child("tests.spark.crash_child", plan, folder, f"run-{run}")
    try:
        code = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise AssertionError(f"run {run} hung; see {log}") from None
    return code, log.read_text(errors="replace")


def kill_and_restart(
    rng: random.Random,
    base: dict[str, object],
    choices: list[str],
    wanted: int,
    files: int,
    tmp_path: Path,
    *,
    after_prepared: str | None,
) -> list[str]:
    """Run the child with a kill at a random one of `choices` until `wanted` kills happened
    (`after_prepared` is a choice too after a kill that left a participant prepared), then
    once without a kill, to the end of the input; return the kills."""
    checkpoint = Path(str(base["checkpoint"]))
    kills: list[str] = []
    previous = ""
    for run in range(3 * wanted):
        if len(kills) >= wanted:
            break
        upcoming = next_epoch(checkpoint)
        leftover = after_prepared is not None and previous in LEAVE_PREPARED
        offered = [*choices, after_prepared] if leftover and after_prepared else choices
        if ONLY:  # a debugging knob: only these kill points
            offered = [c for c in offered if c in ONLY] or offered
        kill = rng.choice(offered)
        # A fresh batch passes every kill point; a replayed one may not (see is_replay).
        ahead = 1 if is_replay(checkpoint) else rng.choice([0, 0, 1])
        epoch = min(upcoming + ahead, files - 1)
        plan = {**base, "kill": kill, "kill_epoch": epoch}
        code, output = run_child(plan, tmp_path, run)
        assert code in (0, -9), f"run {run} ({kill} at epoch {epoch}) failed:\n{output[-3000:]}"
        if code == -9:
            killed_in_task = (tmp_path / f"task-killed-{epoch}").exists()
            assert "killing" in output or killed_in_task, output[-2000:]
            kills.append(f"{kill}@{epoch}")
            previous = kill
        else:
            previous = ""
    assert len(kills) >= wanted, f"only {len(kills)} kills happened (seed {SEED}): {kills}"
    print(f"seed {SEED}: {len(kills)} kills in {run + 1} runs: {kills}")

    code, output = run_child({**base, "kill": None, "kill_epoch": -1}, tmp_path, 999)
    assert code == 0, output[-3000:]
    assert next_epoch(checkpoint) == files, "the query did not process every file"
    return kills


@pytest.mark.timeout(max(900, 60 * KILLS))
@pytest.mark.parametrize(
    "mode",
    [
        # The crash tier's (make test-crash, CI's rotation): the default suite kills a
        # driver-mode driver in tests/spark/test_demo.py (Postgres + S3 + Kafka) and
        # test_quickstart.py, and every sink's crash points in its conformance sweep.
        pytest.param("driver", marks=pytest.mark.crash_tier),
        "executor",
    ],
)
def test_spark_driver_killed_at_random_moments_then_restarted(
    mode: str,
    postgres: PostgresEndpoint,
    kafka: KafkaEndpoint,
    kafka_topic: str,
    pg_schema: str,
    s3: S3Endpoint,
    s3_prefix: str,
    job_id: str,
    tmp_path: Path,
    testbed: Testbed,
    request: pytest.FixtureRequest,
) -> None:
    if TARGET == "cluster":
        request.getfixturevalue("spark_cluster")  # up, both workers alive, held by this test
    lake = IcebergCatalog(postgres, tmp_path)
    request.addfinalizer(lake.drop)
    lake.create_namespace()
    lake.catalog().create_table(("ds", "events"), schema=SOURCE_SCHEMA)
    rng = random.Random(SEED)
    s3_path = f"s3://{s3.bucket}/{s3_prefix.rstrip('/')}"
    files = 2 * KILLS + 4
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    for n in range(files):
        write_input(source, f"part-{n:04d}.json", range(n * ROWS_PER_FILE, (n + 1) * ROWS_PER_FILE))
    base: dict[str, object] = {
        "dsn": postgres.conninfo(),
        "table": f"{pg_schema}.events",
        "bootstrap_servers": kafka.bootstrap_servers,
        "topic": kafka_topic,
        "job_id": job_id,
        "source": str(source),
        "checkpoint": str(checkpoint),
        "mode": mode,
        "files": str(tmp_path / "out"),
        "s3": s3_options(s3, s3_path),
        "delta": str(tmp_path / "delta"),
        "iceberg": lake.sink_options(),
        "flags": str(tmp_path),
        "target": TARGET,
    }
    choices = (IN_BATCH if mode == "driver" else IN_EXECUTOR_BATCH) + RECOVERY[mode]
    kills = kill_and_restart(
        rng, base, choices, KILLS, files, tmp_path, after_prepared="recovery:after-resolve:postgres"
    )

    expected = list(range(files * ROWS_PER_FILE))
    dsn = postgres.conninfo()
    context = f"{mode} mode, seed {SEED}, kills {kills}"
    found = {"Postgres": postgres_ids(dsn, f"{pg_schema}.events")}
    if mode == "driver":
        found["Kafka"] = kafka_ids(kafka, kafka_topic)
        open_kafka = kafka_open_transactions(kafka, kafka_topic, f"{kafka_topic}-ds-progress")
        assert open_kafka == [], context
    else:
        found["files"] = published_file_ids(tmp_path / "out")
        assert sorted((tmp_path / "out" / STAGING).iterdir()) == [], context
    found["S3"] = s3_committed_ids(s3, s3_path)
    found["Delta"] = delta_ids(tmp_path / "delta")
    assert delta_leftovers(tmp_path / "delta") == [], context
    found["Iceberg"] = iceberg_ids(lake.sink_options())
    # Java's Iceberg too: Spark's own reader, through its catalog on the same SQL catalog.
    read = read_with_spark(
        testbed, lake.name, lake.properties(), lake.identifier(), tmp_path / "spark-read"
    )
    found["Iceberg, read by Spark's Iceberg reader"] = sorted(read.column("id"))
    orphans = iceberg_orphans(lake.sink_options(), job_id)
    assert orphans == [], f"Iceberg data files outside the table ({context}): {orphans}"
    uploads = incomplete_uploads(s3.client(), s3.bucket, s3_prefix)
    assert uploads == [], f"incomplete S3 uploads left ({context}): {uploads}"
    for sink, ids in found.items():
        assert len(ids) == len(set(ids)), f"duplicates in {sink} ({context})"
        assert ids == expected, f"{sink} rows lost ({context})"
    assert prepared_transactions(dsn, job_id) == [], context
    epochs = delta_epochs(tmp_path / "delta")
    assert epochs == sorted(set(epochs)), f"not one Delta commit per epoch ({context}): {epochs}"
    epochs = iceberg_epochs(lake.sink_options(), job_id)
    assert epochs == sorted(set(epochs)), f"not one Iceberg commit per epoch ({context}): {epochs}"


# The crash tier's (make test-crash, CI's rotation): the default suite's driver- and executor-
# mode kills above, and the conformance scenarios of Kafka and Delta without a decision store,
# go through the same paths.
@pytest.mark.crash_tier
@pytest.mark.timeout(max(900, 90 * LONE_KILLS))
@pytest.mark.parametrize("mode", sorted(LONE))
def test_a_lone_sink_without_a_decision_store_killed_then_restarted(
    mode: str, kafka: KafkaEndpoint, kafka_topic: str, job_id: str, tmp_path: Path
) -> None:
    """Kafka alone keeps its job's decisions and generations in its progress topic, a Delta
    table alone in its folder: no decision_store, and still every row exactly once."""
    rng = random.Random(SEED)
    files = 2 * LONE_KILLS + 2
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    for n in range(files):
        write_input(source, f"part-{n:04d}.json", range(n * ROWS_PER_FILE, (n + 1) * ROWS_PER_FILE))
    base: dict[str, object] = {
        "bootstrap_servers": kafka.bootstrap_servers,
        "topic": kafka_topic,
        "job_id": job_id,
        "source": str(source),
        "checkpoint": str(checkpoint),
        "mode": mode,
        "delta": str(tmp_path / "delta"),
        "flags": str(tmp_path),
        "target": "local",
    }
    # Kafka leaves nothing prepared (its open transaction dies with the producer).
    resolve = None if mode == "kafka-alone" else "recovery:after-resolve:delta"
    kills = kill_and_restart(
        rng, base, LONE[mode], LONE_KILLS, files, tmp_path, after_prepared=resolve
    )
    context = f"{mode}, seed {SEED}, kills {kills}"
    if mode == "kafka-alone":
        ids = kafka_ids(kafka, kafka_topic)
        progress = f"{kafka_topic}-ds-progress"
        assert kafka_open_transactions(kafka, kafka_topic, progress) == [], context
    else:
        ids = delta_ids(tmp_path / "delta")
        assert delta_leftovers(tmp_path / "delta") == [], context
        epochs = delta_epochs(tmp_path / "delta")
        assert epochs == sorted(set(epochs)), f"not one Delta commit per epoch ({context})"
    assert len(ids) == len(set(ids)), f"duplicates ({context})"
    assert ids == list(range(files * ROWS_PER_FILE)), f"rows lost ({context})"


# The crash tier's: the default suite's driver- and executor-mode kills above, and the
# dead-letter conformance scenarios, go through the same paths.
@pytest.mark.crash_tier
@pytest.mark.timeout(max(900, 60 * KILLS))
@pytest.mark.parametrize("mode", ["driver", "executor"])
def test_bad_rows_into_a_dead_letter_table_killed_then_restarted(
    mode: str, postgres: PostgresEndpoint, pg_schema: str, job_id: str, tmp_path: Path
) -> None:
    """A stream carrying rows of every kind the Postgres table refuses (NOT NULL, NUL
    character, varchar(n) length, numeric overflow, timestamp range, foreign key, unique,
    check) mixed into good rows, on_bad_rows="dead_letter" into a Postgres dead-letter table,
    the driver SIGKILLed at random moments: afterwards every row is in exactly one of the
    table and the dead letter, once, each dead letter with the reason its kind says, and
    nothing is left prepared."""
    rng = random.Random(SEED)
    dsn = postgres.conninfo()
    table, letters = bad_rows.create_tables(dsn, pg_schema)
    files = 2 * KILLS + 2
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    per_file = bad_rows.ROWS_PER_FILE
    for n in range(files):
        bad_rows.write_input(source, f"part-{n:04d}.json", range(n * per_file, (n + 1) * per_file))
    base: dict[str, object] = {
        "dsn": dsn,
        "table": table,
        "dead_letter_table": letters,
        "bad_rows": True,
        "job_id": job_id,
        "source": str(source),
        "checkpoint": str(checkpoint),
        "mode": mode,
        "flags": str(tmp_path),
        "target": "local",
    }
    kills = kill_and_restart(
        rng,
        base,
        BAD_ROWS[mode] + BAD_ROWS_RECOVERY,
        KILLS,
        files,
        tmp_path,
        # Driver mode's table is its commit point (one-phase): a kill before the decision may
        # leave only the dead letters prepared, so any sink's resolution is a kill point.
        after_prepared="recovery:after-resolve",
    )
    context = f"{mode} mode, seed {SEED}, kills {kills}"
    bad_rows.check_every_row_in_one_place(
        bad_rows.target_ids(dsn, table),
        bad_rows.dead_letters(dsn, letters),
        files * per_file,
        job_id,
        context,
    )
    assert prepared_transactions(dsn, job_id) == [], context


@pytest.mark.crash_tier
@pytest.mark.timeout(max(900, 90 * ROUTED_KILLS))
@pytest.mark.parametrize("dead_letters", [False, True], ids=["routed", "routed+dead-letters"])
def test_rows_routed_to_three_topics_by_their_topic_column_killed_then_restarted(
    dead_letters: bool, kafka: KafkaEndpoint, unique: UniqueNames, job_id: str, tmp_path: Path
) -> None:
    """No topic option: each row goes to the topic its `topic` column names (Spark's rule),
    all three topics in each epoch's one transaction (with `dead_letters`, every 7th row names
    a topic outside the sink's bounds and goes to a Kafka dead-letter topic in that same
    transaction); the driver SIGKILLed at random moments: afterwards each topic's
    read_committed content is exactly its rows, once, and no transaction is left open."""
    rng = random.Random(SEED)
    prefix = unique.name("routed")
    topics = [f"{prefix}-{n}" for n in range(3)]
    progress = f"{prefix}-progress"
    letters = f"{prefix}-dlq"
    made = topics[:2] + ([letters] if dead_letters else [])  # the sink makes the third
    with kafka_topics(kafka, made, prefix):
        files, source, checkpoint = input_files(tmp_path, 2 * ROUTED_KILLS + 2)
        base: dict[str, object] = {
            "bootstrap_servers": kafka.bootstrap_servers,
            "topics": topics,
            "progress_topic": progress,
            "job_id": job_id,
            "source": str(source),
            "checkpoint": str(checkpoint),
            "mode": "kafka-routed",
            "dead_letter_topic": letters if dead_letters else None,
            "flags": str(tmp_path),
            "target": "local",
        }
        choices = ROUTED if not dead_letters else [*ROUTED, "recovery:after-open:dead_letters"]
        kills = kill_and_restart(
            rng, base, choices, ROUTED_KILLS, files, tmp_path, after_prepared=None
        )
        context = f"seed {SEED}, kills {kills}"
        every = range(files * ROWS_PER_FILE)
        bad = {i for i in every if dead_letters and i % 7 == 6}
        for n, topic in enumerate(topics):
            found = kafka_ids(kafka, topic)
            assert len(found) == len(set(found)), f"duplicates in {topic} ({context})"
            wanted = [i for i in every if i % 3 == n and i not in bad]
            assert found == wanted, f"{topic} ({context})"
        if dead_letters:
            found = dead_letter_ids(kafka, letters)
            assert found == sorted(bad), f"dead letters ({context})"
        written = [*topics, progress, *([letters] if dead_letters else [])]
        assert kafka_open_transactions(kafka, *written) == [], context


@contextlib.contextmanager
def kafka_topics(kafka: KafkaEndpoint, names: list[str], prefix: str) -> Iterator[None]:
    """One-partition topics `names` made for the test; afterwards every topic whose name
    starts with `prefix` (those, the sink's progress topics and any it made) deleted."""
    admin = AdminClient(kafka.config())
    for name in names:
        create_topic(admin, name)
    try:
        yield
    finally:
        gone = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix)]
        for future in admin.delete_topics(gone, request_timeout=30).values():
            future.result(timeout=30)


def input_files(folder: Path, files: int) -> tuple[int, Path, Path]:
    """`files` JSON input files of ROWS_PER_FILE rows each under `folder`/in (one per batch):
    their count, the input folder and the checkpoint folder to use."""
    source = folder / "in"
    for n in range(files):
        write_input(source, f"part-{n:04d}.json", range(n * ROWS_PER_FILE, (n + 1) * ROWS_PER_FILE))
    return files, source, folder / "checkpoint"


def dead_letter_ids(kafka: KafkaEndpoint, topic: str) -> list[int]:
    """The `id` of each dead letter's row in a Kafka dead-letter topic (read_committed)."""
    admin = AdminClient(kafka.config())
    found = []
    for message in read_committed(kafka, admin, topic):
        letter = json.loads(message.value() or b"{}")
        assert letter["reason"] == "invalid_value", letter
        found.append(int(json.loads(json.loads(letter["row_json"])["value"])["id"]))
    return sorted(found)


@pytest.mark.crash_tier
@pytest.mark.timeout(max(900, 90 * ROUTED_KILLS))
def test_postgres_and_two_kafka_topics_in_one_job_killed_then_restarted(
    kafka: KafkaEndpoint,
    postgres: PostgresEndpoint,
    pg_schema: str,
    unique: UniqueNames,
    job_id: str,
    tmp_path: Path,
) -> None:
    """Two Kafka sinks of one cluster share one transaction per epoch, the first carrying
    the decision, with a Postgres table prepared before it; the driver SIGKILLed at random
    moments: afterwards the table and both topics hold every row exactly once, nothing is
    left prepared or open."""
    rng = random.Random(SEED)
    prefix = unique.name("two")
    topic, audit = f"{prefix}-events", f"{prefix}-audit"
    with kafka_topics(kafka, [topic, audit], prefix):
        files, source, checkpoint = input_files(tmp_path, 2 * ROUTED_KILLS + 2)
        base: dict[str, object] = {
            "bootstrap_servers": kafka.bootstrap_servers,
            "topic": topic,
            "audit_topic": audit,
            "dsn": postgres.conninfo(),
            "table": f"{pg_schema}.events",
            "job_id": job_id,
            "source": str(source),
            "checkpoint": str(checkpoint),
            "mode": "two-kafka",
            "flags": str(tmp_path),
            "target": "local",
        }
        kills = kill_and_restart(
            rng,
            base,
            TWO_KAFKA,
            ROUTED_KILLS,
            files,
            tmp_path,
            after_prepared="recovery:after-resolve:postgres",
        )
        context = f"seed {SEED}, kills {kills}"
        every = list(range(files * ROWS_PER_FILE))
        for name in (topic, audit):
            found = kafka_ids(kafka, name)
            assert found == every, f"{name} ({context})"
        assert postgres_ids(postgres.conninfo(), f"{pg_schema}.events") == every, context
        assert prepared_transactions(postgres.conninfo(), job_id) == [], context
        progress = [f"{t}-ds-progress" for t in (topic, audit)]
        assert kafka_open_transactions(kafka, topic, audit, *progress) == [], context
