"""The docs' reference tables are generated from the code (tests/support/docs_reference.py):
each region is what the code gives now, every built-in kind has its options table in a page,
and every option of every typed configuration is documented under its field."""

from __future__ import annotations

from durable_sinks import sinks
from tests.support import docs_reference


def test_every_generated_table_is_what_the_code_gives_now() -> None:
    stale = docs_reference.stale()
    assert not stale, f"generated tables out of date (run `make docs`): {stale}"


def test_every_built_in_kind_has_its_options_table_and_the_kinds_table_is_shown() -> None:
    shown = {
        match["name"]
        for path in docs_reference.FILES
        for match in docs_reference.regions(path.read_text())
    }
    missing = {f"options {kind}" for kind in sinks.built_in()} - shown
    assert not missing, f"no page shows {sorted(missing)}"
    assert "kinds" in shown


def test_every_option_of_every_typed_configuration_is_documented_under_its_field() -> None:
    for kind in sinks.built_in():
        table = docs_reference.options_table(kind)  # asserts each field has a docstring
        assert table.count("\n") >= 3, kind
