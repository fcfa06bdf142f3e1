"""The Python examples of the README and docs/: every ```python block, as the modules a test
type-checks (tests/unit/test_doc_examples.py).

The blocks of one page are one module, in page order, as a reader follows them: a block may
use what an earlier block of its page defined. Besides those, a block may assume the names of
`PRELUDE`, what a streaming job has at hand (`spark`, a streaming `df`). An indented block (in
a list item) is dedented first. Each block starts with a comment naming its page and line, so
that an error points at the docs.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
#: What every example may assume: a Spark session, a streaming DataFrame and the connection
#: string of the job's Postgres database.
PRELUDE = """\
from pyspark.sql import DataFrame, SparkSession

spark: SparkSession
df: DataFrame
dsn: str
"""
_FENCE = re.compile(r"^(\s*)```python\s*$")
_END = re.compile(r"^\s*```\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the block's first line of code, 1-based
    code: str


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        if _FENCE.match(lines[index]):
            end = index + 1
            while not _END.match(lines[end]):
                end += 1
            code = textwrap.dedent("\n".join(lines[index + 1 : end]))
            found.append(Block(page, index + 2, code))
            index = end
        index += 1
    return found


def module(page_blocks: list[Block]) -> str:
    """One page's blocks as one module, after the prelude."""
    parts = [f"# --- {b.page.relative_to(ROOT)}:{b.line}\n{b.code}\n" for b in page_blocks]
    return PRELUDE + "\n\n" + "\n\n".join(parts)


def write_modules(folder: Path) -> dict[Path, list[Block]]:
    """Each page's module written into `folder` (`doc_<page>.py`), with its blocks."""
    written = {}
    for page in PAGES:
        found = blocks(page)
        if found:
            path = folder / f"doc_{page.stem.replace('-', '_').lower()}.py"
            path.write_text(module(found))
            written[path] = found
    return written
