"""Sink kinds: built-in and installed kinds are built through one SinkKind, with the same
option checks (unknown names with the closest one, required options, types, the class's own
value checks); a bare-callable entry point still works, unchecked; a broken entry point is a
ConfigError naming its distribution and entry point and leaves every other kind working."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from durable_sinks import ConfigError, durable_sink, sink
from durable_sinks import sinks as registry
from durable_sinks.core import SinkKind
from durable_sinks.sinks.folder import FolderSink
from durable_sinks.spark._datasource import parse_options
from tests.support.plugin_sink import LedgerConfig


@pytest.mark.parametrize("kind", list(registry.built_in()))
def test_every_built_in_kind_is_a_sink_kind(kind: str) -> None:
    found = registry.kind_of(kind)
    assert isinstance(found, SinkKind)
    assert found.name == kind
    assert registry.config_class_of(kind) is found.config_class
    assert registry.options_of(kind) == found.options()


def test_built_in_kinds_convert_paths_and_single_names_by_declared_type(tmp_path: Path) -> None:
    built = registry.create("files", {"path": tmp_path / "out"})
    assert isinstance(built, FolderSink)
    assert built.config.path == str(tmp_path / "out")
    postgres = registry.kind_of("postgres")
    assert postgres is not None
    config = postgres.configure({"dsn": "host=x", "table": "t", "mode": "upsert", "key": "id"})
    assert config.key == ("id",)


def test_an_installed_kind_is_listed_and_built_with_its_own_options(
    plugin_dists: Path, tmp_path: Path
) -> None:
    assert {"ledger", "ledger_bare", "jsonl"} <= set(registry.kinds())
    assert registry.config_class_of("ledger") is LedgerConfig
    assert registry.options_of("ledger") == ["folder", "name", "durable"]
    built = registry.create("ledger", {"folder": tmp_path / "l", "durable": False})
    assert isinstance(built, FolderSink)
    assert built.config.path == str(tmp_path / "l")
    assert built.config.fsync is False


@pytest.mark.parametrize(
    ("options", "message", "fix"),
    [
        (
            {"foldr": "/x"},
            "ledger sink 'ledger': unknown option 'foldr'; did you mean 'folder'?",
            "write folder=...",
        ),
        ({"name": "l"}, "ledger sink 'l': missing required option 'folder'", "give folder=..."),
        (
            {"folder": "/x", "durable": "yes"},
            "durable must be True or False, not str 'yes'",
            "durable=True (a Python bool, not a string)",
        ),
        (
            {"folder": "relative/x"},
            "ledger sink: folder 'relative/x' is not an absolute path",
            "as an absolute path",
        ),
    ],
)
def test_an_installed_kind_gets_the_built_in_option_checks(
    plugin_dists: Path, options: dict[str, object], message: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        registry.create("ledger", options)
    assert message in caught.value.message
    assert caught.value.fix is not None
    assert fix in caught.value.fix


def test_durable_sink_and_sink_name_the_closest_option_of_an_installed_kind(
    plugin_dists: Path,
) -> None:
    with pytest.raises(ConfigError, match="unknown option 'foldr'; did you mean 'folder'"):
        durable_sink("ledger", foldr="/tmp/l", job_id="orders")
    with pytest.raises(ConfigError, match="unknown option 'durabel'; did you mean 'durable'"):
        sink("ledger", folder="/tmp/l", durabel=True)
    with pytest.raises(ConfigError) as caught:
        sink("ledgr", folder="/tmp/l")
    assert caught.value.fix == "write 'ledger'"


def test_a_bare_callable_entry_point_is_built_unchecked(plugin_dists: Path, tmp_path: Path) -> None:
    assert registry.config_class_of("ledger_bare") is None
    assert registry.options_of("ledger_bare") is None
    built = registry.create("ledger_bare", {"folder": tmp_path, "anything": 1})
    assert isinstance(built, FolderSink)
    assert built.name == "ledger_bare"


@pytest.mark.parametrize(
    ("kind", "what"),
    [
        ("broken_import", "cannot be loaded: ModuleNotFoundError"),
        ("not_a_kind", "is a str, not a SinkKind"),
        ("misnamed", "names a SinkKind called 'ledger'"),
    ],
)
def test_a_broken_entry_point_names_its_distribution_and_spares_other_kinds(
    plugin_dists: Path, tmp_path: Path, kind: str, what: str
) -> None:
    assert kind in registry.kinds()
    with pytest.raises(ConfigError) as caught:
        registry.create(kind, {})
    assert "ds-test-broken-plugins" in caught.value.message
    assert f"entry point {kind} = " in caught.value.message
    assert what in caught.value.message
    assert caught.value.fix is not None
    with pytest.raises(ConfigError, match="ds-test-broken-plugins"):
        sink(kind)
    # Every other kind, built-in or installed, still builds.
    assert isinstance(registry.create("jsonl", {"path": str(tmp_path / "j")}), FolderSink)
    assert isinstance(registry.create("ledger", {"folder": str(tmp_path / "l")}), FolderSink)


def test_without_the_distribution_its_kinds_are_unknown() -> None:
    assert "ledger" not in registry.kinds()
    with pytest.raises(ConfigError, match="no sink kind 'ledger'") as caught:
        registry.create("ledger", {"folder": "/x"})
    assert caught.value.fix is not None
    assert "durable_sinks.sinks" in caught.value.fix


@dataclass(frozen=True)
class _Options:
    where: str


def test_a_sink_kind_refuses_what_cannot_work() -> None:
    with pytest.raises(ConfigError, match="config_class must be a dataclass"):
        SinkKind("odd", dict, FolderSink)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="build must be callable"):
        SinkKind("odd", _Options, "not callable")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="non-empty string"):
        SinkKind("", _Options, FolderSink)  # type: ignore[arg-type]


def test_register_refuses_a_built_in_name() -> None:
    with pytest.raises(ConfigError, match="already registered"):
        registry.register(SinkKind("files", _Options, FolderSink))


def test_the_data_source_reads_an_installed_kinds_string_options_as_declared(
    plugin_dists: Path,
) -> None:
    specs, job = parse_options(
        {"kind": "ledger", "folder": "/data/ledger", "durable": "false", "job_id": "orders"}
    )
    (spec,) = specs
    assert spec.config == {"folder": "/data/ledger", "durable": False}
    assert job.job_id == "orders"
