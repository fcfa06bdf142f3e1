"""The docs' reference tables are generated from the code (tests/support/docs_reference.py):
each region is what the code gives now, every built-in kind has its options table in a page,
every option of every typed configuration and of the job is documented under its field, and
the troubleshooting page quotes the messages the code gives."""

from __future__ import annotations

import json
import re
from pathlib import Path

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


def test_the_guide_shows_the_job_options_table_with_every_option_documented() -> None:
    from durable_sinks.spark import JobOptions

    names = [m["name"] for m in docs_reference.regions(docs_reference.GUIDE.read_text())]
    assert "job options" in names
    table = docs_reference.job_options_table(docs_reference.GUIDE)  # asserts the docstrings
    shown = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert shown == list(JobOptions.__dataclass_fields__)


def test_the_job_options_links_are_rewritten_for_a_region_outside_the_guide() -> None:
    text = (
        "[Driver mode](#driver-mode), [Metrics](operations.md#metrics), "
        "[dead letters](dead-letters.md), [site](https://example.com/x)"
    )
    assert docs_reference.relink(text, docs_reference.GUIDE) == text
    assert docs_reference.relink(text, docs_reference.ROOT / "README.md") == (
        "[Driver mode](docs/guide.md#driver-mode), [Metrics](docs/operations.md#metrics), "
        "[dead letters](docs/dead-letters.md), [site](https://example.com/x)"
    )
    assert docs_reference.relink(text, docs_reference.ROOT / "docs" / "operations.md") == (
        "[Driver mode](guide.md#driver-mode), [Metrics](operations.md#metrics), "
        "[dead letters](dead-letters.md), [site](https://example.com/x)"
    )


def _documented_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The metrics table of the operations page: name -> (type, labels)."""
    text = (docs_reference.ROOT / "docs" / "operations.md").read_text()
    found = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`durable_sinks_"):
            labels = tuple(re.findall(r"`(\w+)`", cells[2]))
            found[cells[0].strip("`")] = (cells[1], labels)
    return found


def test_the_documented_metrics_table_is_what_the_endpoint_serves() -> None:
    """Every metric the Prometheus endpoint registers is in the operations page's table, with
    its type and labels, and the table names no other."""
    from prometheus_client import CollectorRegistry

    from durable_sinks.spark._prometheus import Families

    registry = CollectorRegistry()
    Families(registry)
    served = {}
    for collector in registry._collector_to_names:
        if not hasattr(collector, "_type"):  # a collector of its own: the families it yields
            for family in collector.collect():
                served[family.name] = (family.type, tuple(family._labelnames))  # type: ignore[attr-defined]
            continue
        kind = collector._type
        name = collector._name + ("_total" if kind == "counter" else "")  # type: ignore[attr-defined]
        served[name] = (kind, tuple(collector._labelnames))  # type: ignore[attr-defined]
    assert _documented_metrics() == served


def test_the_errors_page_names_every_error_class_and_no_other() -> None:
    from durable_sinks.core import errors

    classes = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.DurableSinkError)
    }
    text = (docs_reference.ROOT / "docs" / "errors.md").read_text()
    named = set(re.findall(r"`([A-Z][A-Za-z]*Error)`", text))
    assert named == classes, (sorted(classes - named), sorted(named - classes))


def test_the_troubleshooting_pages_messages_are_the_codes() -> None:
    """Every message docs/troubleshooting.md quotes (the code spans of the first cell of its
    message tables) is one the code can raise or log, piece by piece between its `…`s
    (tests/support/docs_reference.py says how pieces match the code's string literals).

    The page marks another program's words by naming it before the quote: Postgres's
    `maximum number of prepared transactions reached`, Spark's `AnalysisException: ...`,
    Python's `ModuleNotFoundError: ...` (the names: `docs_reference.OTHER_PROGRAMS`). A marked
    quote is not checked against the code, but must not be the code's own text."""
    unmatched = docs_reference.unmatched_messages()
    assert not unmatched, "\n".join(
        ["the troubleshooting page quotes messages the code does not give:", *unmatched]
    )


def test_the_message_check_finds_a_changed_message_and_a_wrong_marker(tmp_path: Path) -> None:
    """The check names the page's line and the piece that no message of the code has, and a
    quote marked as another program's that is the code's own."""
    page = tmp_path / "troubleshooting.md"
    page.write_text(
        "| message starts with | cause | fix |\n"
        "|---|---|---|\n"
        "| `guarantee '…' is not one of […]` | ok | ok |\n"
        "| `guarantee '…' is not a known guarantee` | changed | ok |\n"
        "| Postgres's `maximum number of prepared transactions reached` | theirs | ok |\n"
        "| Spark's `guarantee '…' is not one of […]` | ours, marked | ok |\n"
        "| Postgres's `out of shared memory` or `job_id is empty` | ours, in a marked list | ok |\n"
    )
    found = docs_reference.unmatched_messages(page)
    assert len(found) == 3, found
    assert found[0].startswith(f"{page}:4: 'is not a known guarantee'"), found
    assert found[1].startswith(f"{page}:6: Spark's"), found
    assert found[2].startswith(f"{page}:7: Postgres's 'job_id is empty'"), found


def test_the_grafana_dashboard_queries_every_served_metric_and_no_other() -> None:
    """docs/grafana-dashboard.json: every metric of the operations page's table (what the
    endpoint serves, test above) is in one of its queries, and it queries no other."""
    dashboard = json.loads((docs_reference.ROOT / "docs" / "grafana-dashboard.json").read_text())
    queried = {
        name.removesuffix("_bucket")
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(durable_sinks_\w+)", target["expr"])
    }
    assert queried == set(_documented_metrics())
