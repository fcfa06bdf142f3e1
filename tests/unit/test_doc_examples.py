"""Every Python example of the README and docs/ type-checks with `mypy --strict` against the
installed package (tests/support/doc_examples.py): an example that no longer matches the API
(a renamed option, a class a union left out, an undefined name) fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support import doc_examples

#: The user property the test records its counts under (printed at the end of the run).
EXAMPLES_PROPERTY = "doc-examples"


def test_every_python_example_of_the_docs_type_checks(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    written = doc_examples.write_modules(tmp_path)
    count = sum(len(found) for found in written.values())
    record_property(EXAMPLES_PROPERTY, {"blocks": count, "pages": len(written)})
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
