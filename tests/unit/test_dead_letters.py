"""Dead letters through the coordinator, with files sinks (no server): refused rows land in
the dead-letter sink in the same epoch and decision as the good rows, a crash anywhere leaves
each row in exactly one place, the cap fails the epoch with nothing visible, and the job's
configuration is checked before anything runs."""

from __future__ import annotations

import datetime
import decimal
import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable_sinks.coordinator import Coordinator, EpochOutcome, prepare_part
from durable_sinks.core import DeliveryGuarantee, SinkConnector
from durable_sinks.core.bad_rows import (
    BadRowCap,
    BadRowPolicy,
    BadRowsError,
    RefusalReason,
    RefusedRows,
    SchemaEvolution,
    TooManyBadRowsError,
    WritePolicy,
    dead_letter_schema,
)
from durable_sinks.core.errors import CapabilityError, ConfigError
from durable_sinks.manifest import DecisionRecord, LocalDirectoryStore
from durable_sinks.sinks.folder import Files, FolderSink
from durable_sinks.spark._options import JobOptions
from tests.support.refusing_sink import NEGATIVE, RefusingFileSink

ISOLATE = WritePolicy(BadRowPolicy.DEAD_LETTER)


def rows(*values: int, prefix: str = "k") -> pa.RecordBatch:
    return pa.record_batch({"key": [f"{prefix}{i}" for i in range(len(values))], "v": values})


def target(tmp_path: Path, name: str = "t") -> RefusingFileSink:
    return RefusingFileSink(Files(str(tmp_path / name), name=name))


def files(tmp_path: Path, name: str) -> FolderSink:
    return FolderSink(Files(str(tmp_path / name), name=name))


def coordinator(
    tmp_path: Path,
    sinks: list[SinkConnector],
    dead_letter: SinkConnector | None,
    cap: int | float = 0.5,
    **kwargs: object,
) -> Coordinator:
    made = Coordinator(
        "job",
        sinks,
        LocalDirectoryStore(tmp_path / "store"),
        policy=ISOLATE if dead_letter is not None else WritePolicy(),
        dead_letter=dead_letter,
        bad_row_cap=BadRowCap(cap),
        **kwargs,  # type: ignore[arg-type]
    )
    made.start()
    return made


def committed(tmp_path: Path, name: str) -> list[dict[str, object]]:
    """Every row of the files sink's published epochs."""
    found: list[dict[str, object]] = []
    for marker in sorted((tmp_path / name).glob("epoch=*/part=*/_EPOCH.json")):
        for part in sorted(marker.parent.glob("*.parquet")):
            found.extend(pq.read_table(part).to_pylist())
    return found


def test_refused_rows_commit_into_the_dead_letter_with_the_good_rows(tmp_path: Path) -> None:
    job = coordinator(tmp_path, [target(tmp_path)], files(tmp_path, "dl"))
    result = job.run_epoch(0, [rows(1, -2, 3), rows(-4, 5, prefix="m")])

    assert result.outcome is EpochOutcome.COMMITTED
    assert sorted(str(r["key"]) for r in committed(tmp_path, "t")) == ["k0", "k2", "m1"]
    letters = committed(tmp_path, "dl")
    assert [(d["sink"], d["row_number"], d["reason"]) for d in letters] == [
        ("t", 1, "check"),
        ("t", 3, "check"),
    ]
    assert [json.loads(str(d["row_json"])) for d in letters] == [
        {"key": "k1", "v": -2},
        {"key": "m0", "v": -4},
    ]
    first = letters[0]
    assert (first["job_id"], first["epoch"], first["part"]) == ("job", 0, "driver")
    assert (first["column_name"], first["constraint_name"]) == ("v", "v_not_negative")
    assert first["message"] == NEGATIVE.message
    assert result.decision.dead_letters == {"t": {"check": 2}}
    assert {h.sink: h.rows for h in result.decision.handles} == {"t": 3, "dl": 2}
    assert job.totals.dead_letters.by_sink == {"t": {"check": 2}}
    assert result.metrics.dead_letters.total() == 2


def test_an_epoch_without_bad_rows_leaves_the_dead_letter_sink_out(tmp_path: Path) -> None:
    job = coordinator(tmp_path, [target(tmp_path)], files(tmp_path, "dl"))
    result = job.run_epoch(0, [rows(1, 2)])
    assert [h.sink for h in result.decision.handles] == ["t"]
    assert result.decision.dead_letters == {}
    assert not (tmp_path / "dl").exists() or committed(tmp_path, "dl") == []


@pytest.mark.parametrize(
    "crash_after",
    ["after-write:dead-letters:dl", "after-pre-commit:dl", "after-decision", "after-commit:t"],
)
def test_a_crash_anywhere_leaves_each_row_in_exactly_one_place(
    tmp_path: Path, crash_after: str
) -> None:
    batch = rows(1, -2, 3, -4)
    first = coordinator(tmp_path, [target(tmp_path)], files(tmp_path, "dl"))
    steps = first.epoch_steps(0, [batch])
    for step in steps:
        if step == crash_after:
            break  # the process dies here: nothing is rolled back or closed
    else:
        pytest.fail(f"the epoch never reached {crash_after}")

    second = coordinator(tmp_path, [target(tmp_path)], files(tmp_path, "dl"))
    second.run_epoch(0, [batch])  # Spark replays the batch
    assert sorted(str(r["key"]) for r in committed(tmp_path, "t")) == ["k0", "k2"]
    assert sorted(json.loads(str(d["row_json"]))["key"] for d in committed(tmp_path, "dl")) == [
        "k1",
        "k3",
    ]


def test_over_a_count_cap_the_epoch_fails_with_nothing_visible(tmp_path: Path) -> None:
    job = coordinator(tmp_path, [target(tmp_path)], files(tmp_path, "dl"), cap=1)
    with pytest.raises(TooManyBadRowsError) as raised:
        job.run_epoch(0, [rows(-1, 2, -3, -4)])
    error = raised.value
    assert error.sink == "t"
    assert error.epoch == 0
    assert "refused 3 of 4 rows" in error.message
    assert "check (column 'v', constraint 'v_not_negative')" in error.message
    assert "max_bad_rows=1" in error.message
    assert "raise max_bad_rows" in str(error)
    assert committed(tmp_path, "t") == []
    assert committed(tmp_path, "dl") == []
    assert job.run_epoch(0, [rows(1, -2)]).decision.dead_letters == {"t": {"check": 1}}


def test_a_fraction_cap_is_held_against_the_sinks_rows_in_the_epoch(tmp_path: Path) -> None:
    job = coordinator(tmp_path, [target(tmp_path)], files(tmp_path, "dl"), cap=0.25)
    # 2 of 8 rows: ceil(0.25 * 8) = 2 are allowed
    job.run_epoch(0, [rows(-1, 2, 3, 4), rows(-5, 6, 7, 8)])
    with pytest.raises(TooManyBadRowsError, match=r"max_bad_rows=0.25 \(1 of 4 rows\)"):
        job.run_epoch(1, [rows(-1, -2, 3, 4)])
    assert len(committed(tmp_path, "dl")) == 2


def test_with_the_fail_policy_a_refused_row_fails_the_epoch(tmp_path: Path) -> None:
    job = coordinator(tmp_path, [target(tmp_path)], None)
    with pytest.raises(BadRowsError) as raised:
        job.run_epoch(0, [rows(1, -2)])
    assert raised.value.refused.rows == (1,)
    assert "dead_letter" in str(raised.value)  # the fix names the way out
    assert committed(tmp_path, "t") == []


def test_a_sink_that_ignores_the_policy_still_fails_the_epoch(tmp_path: Path) -> None:
    class Careless(RefusingFileSink):
        def _refuse(
            self, batch: pa.RecordBatch, refused: RefusedRows, epoch: int
        ) -> pa.RecordBatch:
            return batch.filter(refused.kept_mask(batch.num_rows))

    job = coordinator(tmp_path, [Careless(Files(str(tmp_path / "t"), name="t"))], None)
    with pytest.raises(BadRowsError, match="1 of 2 rows cannot be written"):
        job.run_epoch(0, [rows(1, -2)])
    assert committed(tmp_path, "t") == []


def test_each_target_refuses_on_its_own(tmp_path: Path) -> None:
    job = coordinator(
        tmp_path, [target(tmp_path, "t"), files(tmp_path, "plain")], files(tmp_path, "dl")
    )
    job.run_epoch(0, [rows(1, -2)])
    assert len(committed(tmp_path, "plain")) == 2  # that sink takes every row
    assert len(committed(tmp_path, "t")) == 1
    assert [d["sink"] for d in committed(tmp_path, "dl")] == ["t"]


def test_at_least_once_commits_the_dead_letters_first(tmp_path: Path) -> None:
    job = coordinator(
        tmp_path,
        [target(tmp_path)],
        files(tmp_path, "dl"),
        guarantee=DeliveryGuarantee.AT_LEAST_ONCE,
    )
    steps = [step for step in job.epoch_steps(0, [rows(1, -2)]) if step.startswith("after-commit")]
    assert steps == ["after-commit:dl", "after-commit:t"]
    assert len(committed(tmp_path, "dl")) == 1


def test_an_executor_part_prepares_its_own_dead_letters(tmp_path: Path) -> None:
    driver = coordinator(tmp_path, [target(tmp_path)], files(tmp_path, "dl"), executor_mode=True)
    generation = driver.generation
    assert generation is not None

    def prepare(generation: int) -> list:  # type: ignore[type-arg]
        return [
            *prepare_part(
                "job",
                generation,
                0,
                "p0-t0",
                lambda: [target(tmp_path), files(tmp_path, "dl")],
                [rows(1, -2)],
                policy=ISOLATE,
                dead_letter="dl",
                bad_row_cap=BadRowCap(0.5),
            ),
            *prepare_part(
                "job",
                generation,
                0,
                "p1-t1",
                lambda: [target(tmp_path), files(tmp_path, "dl")],
                [rows(3, 4, prefix="m")],
                policy=ISOLATE,
                dead_letter="dl",
                bad_row_cap=BadRowCap(0.5),
            ),
        ]

    result = driver.run_distributed_epoch(0, prepare)
    assert sorted((h.sink, h.rows) for h in result.decision.handles) == [
        ("dl", 1),
        ("t", 1),
        ("t", 2),
    ]
    letters = committed(tmp_path, "dl")
    assert [(d["part"], d["row_number"]) for d in letters] == [("p0-t0", 1)]


def test_an_executor_part_over_the_cap_prepares_nothing(tmp_path: Path) -> None:
    driver = coordinator(tmp_path, [target(tmp_path)], files(tmp_path, "dl"), executor_mode=True)
    assert driver.generation is not None
    with pytest.raises(TooManyBadRowsError):
        prepare_part(
            "job",
            driver.generation,
            0,
            "p0-t0",
            lambda: [target(tmp_path), files(tmp_path, "dl")],
            [rows(-1, -2)],
            policy=ISOLATE,
            dead_letter="dl",
            bad_row_cap=BadRowCap(1),
        )
    assert list((tmp_path / "t").glob("**/*.parquet")) == []


def test_the_decision_record_keeps_the_counts(tmp_path: Path) -> None:
    job = coordinator(tmp_path, [target(tmp_path)], files(tmp_path, "dl"))
    decision = job.run_epoch(0, [rows(-1, 2)]).decision
    again = DecisionRecord.from_bytes(decision.to_bytes(), source="test")
    assert again.dead_letters == {"t": {"check": 1}}
    assert again == decision


# -- configuration ----------------------------------------------------------------------------
def test_a_dead_letter_policy_without_a_dead_letter_sink_is_refused(tmp_path: Path) -> None:
    job = Coordinator(
        "job", [target(tmp_path)], LocalDirectoryStore(tmp_path / "store"), policy=ISOLATE
    )
    with pytest.raises(ConfigError, match="needs a dead-letter sink"):
        job.start()


def test_a_dead_letter_sink_with_the_fail_policy_is_refused(tmp_path: Path) -> None:
    job = Coordinator(
        "job",
        [target(tmp_path)],
        LocalDirectoryStore(tmp_path / "store"),
        dead_letter=files(tmp_path, "dl"),
    )
    with pytest.raises(ConfigError, match="bad rows fail the epoch"):
        job.start()


def test_add_columns_needs_targets_that_evolve(tmp_path: Path) -> None:
    class Fixed(RefusingFileSink):
        def capabilities(self):  # type: ignore[no-untyped-def]
            import dataclasses

            return dataclasses.replace(super().capabilities(), schema_evolution=False)

    job = Coordinator(
        "job",
        [Fixed(Files(str(tmp_path / "t"), name="t"))],
        LocalDirectoryStore(tmp_path / "store"),
        policy=WritePolicy(schema_evolution=SchemaEvolution.ADD_COLUMNS),
    )
    with pytest.raises(CapabilityError, match="add_columns") as raised:
        job.start()
    assert raised.value.sink == "t"


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"on_bad_rows": "skip"}, "is not 'fail' or 'dead_letter'"),
        ({"on_bad_rows": "dead_letter"}, "needs dead_letter"),
        ({"dead_letter": {"kind": "files", "path": "/tmp/x"}}, "on_bad_rows is 'fail'"),
        ({"max_bad_rows": -1}, "max_bad_rows must be a count"),
        ({"max_bad_rows": 1.5}, "max_bad_rows must be a count"),
        ({"schema_evolution": "merge"}, "is not 'none' or 'add_columns'"),
        (
            {"on_bad_rows": "dead_letter", "dead_letter": "postgres"},
            "dead_letter must be a sink",
        ),
    ],
)
def test_job_options_name_the_problem(options: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as raised:
        JobOptions(job_id="orders", **options)  # type: ignore[arg-type]
    assert raised.value.fix


def test_a_dead_letter_named_after_its_kind_is_renamed(tmp_path: Path) -> None:
    options = JobOptions(
        job_id="orders",
        on_bad_rows="dead_letter",
        dead_letter={"kind": "files", "path": str(tmp_path / "dl")},
    )
    assert options.dead_letter.name == "dead_letters"
    assert options.write_policy.isolates


# -- the dead letter's row ----------------------------------------------------------------------
def test_row_json_is_plain_json_for_every_arrow_type() -> None:
    from durable_sinks.coordinator._dead_letters import row_json

    text = row_json(
        {
            "b": b"\x00\xff",
            "d": decimal.Decimal("12.30"),
            "t": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
            "day": datetime.date(2026, 1, 2),
            "dur": datetime.timedelta(seconds=1.5),
            "nan": math.nan,
            "inf": -math.inf,
            "nul": "a\x00b",
            "list": [1, None],
            "map": [("k", 1)],
            "struct": {"x": 1},
        }
    )
    assert json.loads(text) == {
        "b": "AP8=",
        "d": "12.30",
        "t": "2026-01-02T03:04:05+00:00",
        "day": "2026-01-02",
        "dur": 1.5,
        "nan": "NaN",
        "inf": "-Infinity",
        "nul": "a\x00b",
        "list": [1, None],
        "map": [["k", 1]],
        "struct": {"x": 1},
    }
    assert "\x00" not in text


def test_the_dead_letter_schema_names_every_column() -> None:
    assert dead_letter_schema().names == [
        "job_id",
        "epoch",
        "sink",
        "part",
        "row_number",
        "reason",
        "column_name",
        "constraint_name",
        "message",
        "row_json",
    ]


def test_refused_rows_keep_the_first_reason_per_row() -> None:
    check = NEGATIVE
    other = NEGATIVE.__class__(RefusalReason.NOT_NULL, "null", "v")
    merged = RefusedRows((3, 1), (check, check)).merged(RefusedRows((1, 2), (other, other)))
    assert merged.rows == (1, 2, 3)
    assert [r.reason for r in merged.refusals] == ["check", "not_null", "check"]
    assert RefusedRows((0, 1), (check, check)).through([5, 9]).rows == (5, 9)


# -- seen by operators --------------------------------------------------------------------------
def test_inspect_and_verify_show_the_dead_letters_of_the_latest_epochs(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from durable_sinks.cli import main

    job = coordinator(tmp_path, [target(tmp_path)], files(tmp_path, "dl"))
    job.run_epoch(0, [rows(1, -2, -3)])
    job.run_epoch(1, [rows(4)])
    job.close()
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        f'job_id = "job"\ndecision_store = "{tmp_path / "store"}"\n'
        f'on_bad_rows = "dead_letter"\nmax_bad_rows = 0.9\n'
        f'[[sinks]]\nkind = "files"\nname = "t"\npath = "{tmp_path / "t"}"\n'
        f'[dead_letter]\nkind = "files"\nname = "dl"\npath = "{tmp_path / "dl"}"\n'
    )
    inspect = CliRunner().invoke(main, ["inspect", "job", "-f", str(job_file)])
    assert inspect.exit_code == 0, inspect.output
    assert "nothing in doubt" in inspect.output
    cells = [
        [cell.strip() for cell in line.split("│") if cell.strip()]
        for line in inspect.output.splitlines()
        if "check" in line
    ]
    assert cells == [["0", "t", "check", "2"]]
    verify = CliRunner().invoke(main, ["verify", "job", "-f", str(job_file)])
    assert verify.exit_code == 0, verify.output


def test_metrics_and_the_epoch_record_count_dead_letters_per_sink_and_reason(
    tmp_path: Path,
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from durable_sinks.coordinator import JobTotals
    from durable_sinks.spark._observe import add_totals, epoch_record, observe
    from durable_sinks.spark._prometheus import Families

    job = coordinator(tmp_path, [target(tmp_path)], files(tmp_path, "dl"))
    result = job.run_epoch(0, [rows(-1, 2, -3)])
    record = epoch_record(
        "job", 0, result, seconds=0.1, attempts=1, generation=1, execution="driver"
    )
    assert record["dead_letters"] == {"t": {"check": 2}}
    clean = epoch_record(
        "job", 1, job.run_epoch(1, [rows(1)]), seconds=0.1, attempts=1, generation=1, execution="x"
    )
    assert "dead_letters" not in clean

    registry = CollectorRegistry()
    families = Families(registry)
    families.record(observe("job", 0, result, seconds=0.1, counts={}, recovery=None), {})
    text = generate_latest(registry).decode()
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    labels = (("job", "job"), ("reason", "check"), ("sink", "t"))
    assert found[("durable_sinks_dead_letters_total", labels)] == 2

    summed = add_totals(job.totals, job.totals)
    assert summed.dead_letters.by_sink == {"t": {"check": 4}}
    assert add_totals(JobTotals(), None).dead_letters.by_sink == {}


def test_the_data_source_reads_the_dead_letter_options_from_strings() -> None:
    from durable_sinks.spark._datasource import parse_options

    listed = '[{"kind": "files", "path": "/data/out"}]'
    specs, job = parse_options(
        {
            "sinks": listed,
            "job_id": "orders",
            "on_bad_rows": "dead_letter",
            "dead_letter": '{"kind": "files", "path": "/data/dead"}',
            "max_bad_rows": "0.05",
            "schema_evolution": "add_columns",
        }
    )
    assert [s.name for s in specs] == ["files"]
    assert job.dead_letter.name == "dead_letters"
    assert job.dead_letter.config["path"] == "/data/dead"
    assert job.bad_row_cap == BadRowCap(0.05)
    assert job.write_policy == WritePolicy(BadRowPolicy.DEAD_LETTER, SchemaEvolution.ADD_COLUMNS)
    _, counted = parse_options({"sinks": listed, "job_id": "orders", "max_bad_rows": "10"})
    assert counted.max_bad_rows == 10
    with pytest.raises(ConfigError, match="not a valid JSON object"):
        parse_options(
            {"sinks": listed, "job_id": "o", "on_bad_rows": "dead_letter", "dead_letter": "{kind"}
        )
