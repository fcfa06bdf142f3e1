"""The `durable-sinks` command's reading of a job's settings (no servers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_sinks.cli._jobfile import expand, job_settings, parse_option
from durable_sinks.core.errors import ConfigError


def test_references_are_the_options_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SECRET_DSN", "postgresql://u:hunter2@db/x")
    (tmp_path / "pw").write_text("s3cret\n")
    assert expand({"dsn": "${env:SECRET_DSN}", "n": [1, f"${{file:{tmp_path}/pw}}"]}) == {
        "dsn": "postgresql://u:hunter2@db/x",
        "n": [1, "s3cret"],
    }


def test_an_unset_variable_and_a_bare_name_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOT_THERE", raising=False)
    with pytest.raises(ConfigError, match=r"NOT_THERE .* is not set"):
        expand("${env:NOT_THERE}")
    with pytest.raises(ConfigError, match="is not a reference") as raised:
        expand("${NOT_THERE}")
    assert raised.value.fix == "write ${env:NOT_THERE}"


def test_flags_are_json_when_they_parse() -> None:
    assert parse_option("create_table=true") == ("create_table", True)
    assert parse_option("table=events") == ("table", "events")
    assert parse_option('key=["a", "b"]') == ("key", ["a", "b"])
    with pytest.raises(ConfigError, match="not key=value"):
        parse_option("table")


def test_one_sink_from_flags(tmp_path: Path) -> None:
    specs, options = job_settings(
        "orders",
        None,
        "files",
        [f"path={tmp_path}"],
        str(tmp_path / "decisions"),
    )
    assert [s.kind for s in specs] == ["files"]
    assert options.job_id == "orders"
    assert options.decision_store == str(tmp_path / "decisions")


def test_several_sinks_from_a_toml_file(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        'job_id = "orders"\nretain_epochs = 5\n'
        f'[[sinks]]\nkind = "files"\nname = "a"\npath = "{tmp_path / "a"}"\n'
        f'[[sinks]]\nkind = "files"\nname = "b"\npath = "{tmp_path / "b"}"\n'
    )
    specs, options = job_settings("orders", job, None, [], None)
    assert [s.name for s in specs] == ["a", "b"]
    assert options.retain_epochs == 5


def test_a_job_file_of_another_job_is_refused(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text('{"job_id": "payments", "kind": "files", "path": "/tmp/x"}')
    with pytest.raises(ConfigError, match="for job 'payments', not 'orders'"):
        job_settings("orders", job, None, [], None)


def test_sink_options_beside_sinks_are_refused(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(f'table = "x"\n[[sinks]]\nkind = "files"\npath = "{tmp_path}"\n')
    with pytest.raises(ConfigError, match="belong in a sink"):
        job_settings("orders", job, None, [], None)


def test_bad_syntax_is_named(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("job_id = \n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        job_settings("orders", job, None, [], None)
