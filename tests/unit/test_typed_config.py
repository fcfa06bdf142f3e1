"""The typed sink configurations, `from durable_sinks import Postgres, Kafka, S3, Delta,
Files`: each is the sink's own configuration class (frozen, picklable, checked when built,
every option documented), accepted wherever a sink is (`durable_sink(...)`, `sink(...)`, a
list of sinks mixing both forms), and equal in effect to the string form. Nothing here
connects: the DSN points at a closed port and the S3 paths at buckets never contacted."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import pickle
import textwrap
from pathlib import Path
from typing import Any

import pytest

import durable_sinks
from durable_sinks import S3, Delta, Files, Iceberg, Kafka, Postgres, durable_sink, sink, sinks
from durable_sinks.core.errors import ConfigError
from durable_sinks.spark import JobOptions, SinkSpec

DSN = "host=127.0.0.1 port=1 dbname=x user=u password=hunter2-secret"
KAFKA: dict[str, Any] = {"bootstrap_servers": "127.0.0.1:1", "topic": "events"}

#: One valid configuration of each kind, typed and as the string form's options.
EXAMPLES: list[tuple[Any, str, dict[str, Any]]] = [
    (Postgres, "postgres", {"dsn": DSN, "table": "events", "mode": "upsert", "key": ("id",)}),
    (Kafka, "kafka", {**KAFKA, "transaction_timeout_s": 90.0, "header_columns": ("h",)}),
    (S3, "s3", {"path": "s3://lake/events", "part_size_bytes": 16 * 1024 * 1024}),
    (Delta, "delta", {"path": "/tmp/delta-events", "mode": "upsert", "key": ("id",)}),
    (Files, "files", {"path": "/tmp/files-events", "compression": "snappy"}),
    (
        Iceberg,
        "iceberg",
        {
            "table": "events",
            "namespace": "ds",
            "catalog": {"type": "sql", "uri": "postgresql+psycopg://u:hunter2-secret@h/db"},
        },
    ),
]
IDS = [kind for _, kind, _ in EXAMPLES]


def test_the_classes_are_the_sinks_own_configurations_and_keep_their_old_names() -> None:
    from durable_sinks.sinks.delta import Delta
    from durable_sinks.sinks.folder import Files
    from durable_sinks.sinks.kafka import Kafka
    from durable_sinks.sinks.postgres import Postgres
    from durable_sinks.sinks.s3 import S3

    assert Postgres is Postgres
    assert Kafka is Kafka
    assert S3 is S3
    assert Delta is Delta
    assert Files is Files


def test_the_package_exports_the_typed_configuration_of_every_built_in_kind() -> None:
    """Derived from the registry at run time; the static names a type checker reads (the
    TYPE_CHECKING imports and `__all__`) must say the same."""
    typed = durable_sinks.typed_configurations()
    assert set(typed) == {
        cls.__name__ for kind in sinks.built_in() if (cls := sinks.config_class_of(kind))
    }
    for name, cls in typed.items():
        assert getattr(durable_sinks, name) is cls
        assert name in durable_sinks.__all__
    source = ast.parse(inspect.getsource(durable_sinks))
    checked = {
        alias.asname or alias.name
        for node in ast.walk(source)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for statement in node.body
        if isinstance(statement, ast.ImportFrom) and ".config" in (statement.module or "")
        for alias in statement.names
    }
    assert checked == set(typed)


@pytest.mark.parametrize(("cls", "kind", "options"), EXAMPLES, ids=IDS)
def test_a_typed_configuration_is_the_same_sink_as_the_string_form(
    cls: Any, kind: str, options: dict[str, Any]
) -> None:
    config = cls(**options)
    assert cls.kind == kind
    assert sink(config) == sink(kind, **options)
    assert SinkSpec.of(config) == SinkSpec(kind, options)
    # Frozen, picklable (it travels to executors and Spark Connect servers), secrets hidden.
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.name = "other"
    assert pickle.loads(pickle.dumps(config)) == config  # noqa: S301 - our own bytes
    assert "hunter2" not in repr(config)
    assert repr(config).startswith(f"{cls.__name__}(")


@pytest.mark.parametrize(("cls", "kind", "options"), EXAMPLES, ids=IDS)
def test_every_option_is_documented(cls: Any, kind: str, options: dict[str, Any]) -> None:
    """A class docstring, and a docstring under each field (what IDEs show on completion)."""
    assert cls.__doc__
    assert kind in cls.__doc__.lower()
    source = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = next(n for n in source.body if isinstance(n, ast.ClassDef)).body
    documented = {
        node.target.id
        for node, after in itertools.pairwise(body)
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
        and after.value.value.strip()
    }
    fields = {f.name for f in dataclasses.fields(cls)}
    assert fields - documented == set()


def test_a_bad_value_is_refused_when_the_configuration_is_built() -> None:
    with pytest.raises(ConfigError, match=r"is not `table` or `schema\.table`"):
        Postgres(dsn=DSN, table="a.b.c")
    with pytest.raises(ConfigError, match="are both set"):
        Kafka(**KAFKA, transaction_timeout_s=10, max_transaction_timeout_s=20)
    with pytest.raises(ConfigError, match="part_size_bytes"):
        S3(path="s3://lake/events", part_size_bytes=1024)
    with pytest.raises(ConfigError, match="mode 'upsert' needs the key columns"):
        Delta(path="/tmp/d", mode="upsert")
    with pytest.raises(ConfigError, match="`path` is empty"):
        Files(path=" ")


def test_a_dsn_naming_a_primary_and_standby_must_ask_for_the_writable_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGTARGETSESSIONATTRS", raising=False)
    pair = "host=p.example,s.example port=5432,5433 dbname=x user=u password=hunter2-secret"
    with pytest.raises(ConfigError, match="names several servers") as raised:
        Postgres(dsn=pair, table="events")
    assert "p.example:5432,s.example:5433/x" in str(raised.value)
    assert "hunter2" not in str(raised.value)
    Postgres(dsn=pair + " target_session_attrs=read-write", table="events")
    monkeypatch.setenv("PGTARGETSESSIONATTRS", "primary")
    Postgres(dsn=pair, table="events")


def test_durable_sink_takes_a_typed_configuration_and_job_options(tmp_path: Path) -> None:
    writer = durable_sink(
        Files(path=str(tmp_path / "out"), name="out"),
        job_id="orders",
        decision_store=str(tmp_path / "decisions"),
        retain_epochs=5,
    )
    try:
        assert [s.name for s in writer.specs] == ["out"]
        assert writer.options.retain_epochs == 5
        assert writer.specs[0] == SinkSpec("files", {"path": str(tmp_path / "out"), "name": "out"})
    finally:
        writer.close()


def test_a_list_of_sinks_mixes_typed_configurations_and_sink_specs(tmp_path: Path) -> None:
    writer = durable_sink(
        [Files(path=str(tmp_path / "a"), name="a"), sink("files", path=str(tmp_path / "b"))],
        job_id="orders",
        decision_store=str(tmp_path / "decisions"),
    )
    try:
        assert [s.name for s in writer.specs] == ["a", "files"]
        assert all(isinstance(s, SinkSpec) for s in writer.specs)
    finally:
        writer.close()


def test_sink_options_beside_a_typed_configuration_are_refused(tmp_path: Path) -> None:
    files = Files(path=str(tmp_path / "out"))
    with pytest.raises(ConfigError, match=r"options \['compression'\] are not job options"):
        durable_sink(files, job_id="orders", compression="gzip")  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="did you mean 'job_id'"):
        durable_sink(files, job_id="orders", jobid="x")  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match=r"give them to Files\(\.\.\.\)"):
        sink(files, compression="gzip")  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="not JobOptions"):
        sink(JobOptions(job_id="orders"))  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="JobOptions is not a sink"):
        durable_sink([JobOptions(job_id="orders")], job_id="orders")  # type: ignore[list-item]


def test_the_typed_overload_of_durable_sink_names_every_job_option() -> None:
    """The keywords a type checker allows beside a typed configuration are JobOptions'."""
    from durable_sinks.spark import _writer

    module = ast.parse(inspect.getsource(_writer))
    overloads = [
        node
        for node in module.body
        if isinstance(node, ast.FunctionDef)
        and node.name == "durable_sink"
        and any(isinstance(d, ast.Name) and d.id == "overload" for d in node.decorator_list)
    ]
    typed = [o for o in overloads if any(a.arg == "job_id" for a in o.args.kwonlyargs)]
    assert len(overloads) == 2
    assert len(typed) == 1
    keywords = [a.arg for a in typed[0].args.kwonlyargs]
    assert keywords == [f.name for f in dataclasses.fields(JobOptions)]


def test_a_name_or_a_list_given_for_a_tuple_of_names_is_a_tuple_as_in_the_string_form() -> None:
    """`key="order_id"` built directly was taken letter by letter (Delta refused it as
    repeated column names; Postgres kept a bare string)."""
    delta = Delta(path="/tmp/d", mode="upsert", key="order_id", partition_by=["day"])  # type: ignore[arg-type]
    assert (delta.key, delta.partition_by) == (("order_id",), ("day",))
    postgres = Postgres(dsn=DSN, table="events", mode="upsert", key="id")  # type: ignore[arg-type]
    assert postgres.key == ("id",)
    kafka = Kafka(**KAFKA, header_columns=["a", "b"])  # type: ignore[arg-type]
    assert kafka.header_columns == ("a", "b")
    assert Files(path=Path("/tmp/files")).path == "/tmp/files"  # type: ignore[arg-type]
    string_form = sink("delta", path="/tmp/d", mode="upsert", key="order_id", partition_by="day")
    assert string_form.build().config == delta  # type: ignore[attr-defined]


def test_every_built_in_kind_has_a_typed_configuration_that_is_a_sink_as_it_is(
    tmp_path: Path,
) -> None:
    from durable_sinks import sinks
    from durable_sinks.sinks.folder import Jsonl

    typed = {kind: sinks.config_class_of(kind) for kind in sinks.kinds()}
    assert all(getattr(cls, "kind", None) == kind for kind, cls in typed.items()), typed
    jsonl = Jsonl(path=str(tmp_path / "out"))
    assert sink(jsonl) == sink("jsonl", path=str(tmp_path / "out"))


@pytest.mark.parametrize(("cls", "kind", "options"), EXAMPLES, ids=IDS)
def test_every_sink_logs_through_one_logger_with_the_same_fields(
    cls: Any, kind: str, options: dict[str, Any]
) -> None:
    built = sinks.create(kind, options)
    logger = built.logger(3)  # type: ignore[attr-defined]
    assert logger.logger.name == f"durable_sinks.sinks.{kind}"
    message, extra = logger.process("hello", {})
    assert message == f"job=- sink={built.name} epoch=3: hello"
    assert extra["extra"] == {"ds_job": "-", "ds_sink": built.name, "ds_epoch": 3}
