"""Every Python example of the README and docs/ type-checks with `mypy --strict` against the
installed package (tests/support/doc_examples.py): an example that no longer matches the API
(a renamed option, a class a union left out, an undefined name) fails here. Those that run
are run against the test bed by tests/spark/test_doc_examples.py; every shell block of the
README runs in `make test-fresh` (tests/fresh_machine.py) or says why not."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import fresh_machine
from tests.support import doc_examples

#: The user property the test records its counts under (printed at the end of the run).
EXAMPLES_PROPERTY = "doc-examples"


def test_every_python_example_of_the_docs_type_checks(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    written = doc_examples.write_modules(tmp_path)
    count = sum(len(found) for found in written.values())
    typecheck_only = sum(not b.runs for found in written.values() for b in found)
    record_property(
        EXAMPLES_PROPERTY,
        {"blocks": count, "pages": len(written), "typecheck_only": typecheck_only},
    )
    assert count >= 40, written  # the docs hold that many; fewer means the extraction broke
    (tmp_path / "mypy.ini").write_text(
        # Spark's own modules are not analysed (most of a cold run's time; their calls are
        # Any), the test bed's modules are read but not judged (the repository's settings
        # do that), and `my_package` is the sink author's own package in writing-a-sink.md.
        "[mypy]\nstrict = True\nallow_redefinition = True\nwarn_return_any = False\n"
        "[mypy-pyspark.*]\nfollow_imports = skip\n[mypy-py4j.*]\nfollow_imports = skip\n"
        "[mypy-tests.*]\nfollow_imports = silent\n"
        "[mypy-my_package.*]\nignore_missing_imports = True\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            "mypy.ini",
            "--cache-dir",
            str(tmp_path / "mypy-cache"),
            *sorted(p.name for p in written),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MYPYPATH": str(doc_examples.ROOT)},
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_marker_says_why_and_stands_right_before_its_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- example: typecheck-only (needs a Databricks workspace) -->\n\n"
        "```python\nx = 1\n```\n\n```python\ny = x\n```\n"
    )
    first, second = doc_examples.blocks(page)
    assert (first.not_run, first.line, second.runs) == ("needs a Databricks workspace", 4, True)
    for wrong in (
        "<!-- example: typecheck-only -->\n```python\nx = 1\n```\n",  # no reason
        "<!-- example: typecheck-only (why) -->\ntext\n```python\nx = 1\n```\n",
        "<!-- example: not run (why) -->\n```python\nx = 1\n```\n",  # a shell marker
        "```python\nx = 1\n```\n<!-- example: typecheck-only (why) -->\n",
    ):
        page.write_text(wrong)
        with pytest.raises(doc_examples.MarkerError):
            doc_examples.all_blocks(page)


def test_every_marker_of_the_docs_is_well_formed() -> None:
    for page in doc_examples.PAGES:
        doc_examples.all_blocks(page)  # raises MarkerError


def test_every_shell_block_of_the_readme_runs_on_a_fresh_machine_or_says_why_not() -> None:
    found = doc_examples.shell_blocks()
    assert len(found) >= 4, found  # fewer means the extraction broke
    run = fresh_machine.readme_commands()
    for block in found:
        if block.runs:
            commands = doc_examples.shell_commands(block)
            assert commands, block.where
            assert all(c in run for c in commands), (block.where, commands, run)
        else:
            assert block.not_run, block.where
    # the README's test command is run as written, with only the choice of tests added
    assert "make test" in run, run
