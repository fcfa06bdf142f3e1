"""The examples of the README and docs/: every ```python block, as the modules a test
type-checks (tests/unit/test_doc_examples.py) and runs against the test bed
(tests/spark/test_doc_examples.py); and the README's shell blocks, which `make test-fresh`
runs (tests/fresh_machine.py).

The blocks of one page are one module, in page order, as a reader follows them: a block may
use what an earlier block of its page defined. Besides those, a block may assume the names of
`PRELUDE`, what a streaming job has at hand (`spark`, a streaming `df`, the Postgres `dsn`,
Kafka's `brokers`, a `topic` name, a `lake` folder, `checkpoints` for Spark's checkpoints,
`incoming`, a folder of orders as JSON files). An indented block (in a list item) is dedented
first. Each block starts with a comment naming its page and line, so that an error points at
the docs.

Every Python block runs, unless the line before it (blank lines aside) is a marker saying
why it cannot, an HTML comment a reader of the rendered page does not see:

    <!-- example: typecheck-only (needs a Databricks workspace) -->

Such a block is still type-checked. A block that is a whole program the reader saves and
runs says so, `<!-- example: file (quickstart.py) -->`: its page's own test runs it as a
process (tests/spark/test_quickstart.py). Every shell block of the README runs in a fresh
machine's set-up, unless marked the same way: `<!-- example: not run (why) -->`.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
#: What every example may assume: a Spark session, a streaming DataFrame (the columns of
#: `SOURCE_COLUMNS`), the connection string of the job's Postgres database, Kafka's bootstrap
#: servers, a Kafka topic's name, an absolute folder (or `s3://` location) where tables and files go
#: and an absolute folder for Spark's checkpoints.
PRELUDE = """\
from pyspark.sql import DataFrame, SparkSession

spark: SparkSession
df: DataFrame
dsn: str
brokers: str
topic: str
lake: str
checkpoints: str
incoming: str
"""
#: The columns of the examples' streaming `df`: orders (and their customers).
SOURCE_COLUMNS = "order_id LONG, customer STRING, customer_id LONG, amount DOUBLE, id LONG"
_FENCE = re.compile(r"^(\s*)```(\w+)\s*$")
_END = re.compile(r"^\s*```\s*$")
_MARKER = re.compile(
    r"^\s*<!--\s*example:\s*(typecheck-only|not run|file)\s*(?:\((.*)\))?\s*-->\s*$"
)
#: Markers by the language of the blocks they may precede.
MARKERS = {"python": ("typecheck-only", "file"), "sh": ("not run",), "bash": ("not run",)}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the block's first line of code, 1-based
    code: str
    language: str = "python"
    #: Why the block is not run (the marker's reason); None when it runs.
    not_run: str | None = None
    #: The file name of a block that is a whole program, run as a process.
    file: str | None = None

    @property
    def runs(self) -> bool:
        return self.not_run is None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


class MarkerError(ValueError):
    """A marker without a reason, of the wrong kind for its block, or before no block."""


def all_blocks(page: Path) -> list[Block]:
    """Every fenced block of `page` with a language, with its marker's reason."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    marker: tuple[int, str, str] | None = None  # line, kind, reason
    index = 0
    while index < len(lines):
        line = lines[index]
        matched = _MARKER.match(line)
        fence = _FENCE.match(line)
        if matched:
            if marker is not None:
                raise MarkerError(f"{page.name}:{marker[0]}: a marker before no block")
            reason = (matched.group(2) or "").strip()
            if not reason:
                raise MarkerError(f"{page.name}:{index + 1}: a marker must say why, in ()")
            marker = (index + 1, matched.group(1), reason)
        elif fence:
            end = index + 1
            while not _END.match(lines[end]):
                end += 1
            language = fence.group(2)
            if marker is not None and marker[1] not in MARKERS.get(language, ()):
                raise MarkerError(
                    f"{page.name}:{marker[0]}: {marker[1]!r} before a {language} block"
                )
            code = textwrap.dedent("\n".join(lines[index + 1 : end]))
            kind, detail = (marker[1], marker[2]) if marker else (None, None)
            file = detail if kind == "file" else None
            reason = None if kind in (None, "file") else detail
            found.append(Block(page, index + 2, code, language, reason, file))
            marker = None
            index = end
        elif line.strip() and marker is not None:
            raise MarkerError(f"{page.name}:{marker[0]}: a marker before no block")
        index += 1
    if marker is not None:
        raise MarkerError(f"{page.name}:{marker[0]}: a marker before no block")
    return found


def blocks(page: Path) -> list[Block]:
    """The Python blocks of `page`."""
    return [b for b in all_blocks(page) if b.language == "python"]


def shell_blocks(page: Path = README) -> list[Block]:
    """The shell blocks (```sh, ```bash) of `page`."""
    return [b for b in all_blocks(page) if b.language in ("sh", "bash")]


def shell_commands(block: Block) -> list[str]:
    """A shell block's commands: its lines without comments, continuation lines joined."""
    commands, current = [], ""
    for raw in block.code.splitlines():
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        current += line.rstrip("\\").strip() + " " if line else ""
        if line and not line.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def module(page_blocks: list[Block]) -> str:
    """One page's blocks as one module, after the prelude."""
    parts = [f"# --- {b.where}\n{b.code}\n" for b in page_blocks]
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
