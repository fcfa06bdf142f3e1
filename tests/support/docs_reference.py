"""The docs' reference tables, generated from the code.

A region of a Markdown file between `<!-- reference: NAME -->` and `<!-- /reference -->` is
the table NAME, as this module makes it; `python -m tests.support.docs_reference` (`make
docs`) rewrites every region, and `stale()` lists the regions that differ from what the code
gives now (tests/unit/test_docs_reference.py fails on any).

The tables:
- `kinds`: the built-in sink kinds (`durable_sinks.sinks.built_in()`, the one list of them):
  the kind, its typed configuration, what installs its client, what it does (the first
  sentence of its package's docstring, or of its typed configuration's where a package holds
  several kinds) and its page;
- `options KIND`: the options of the kind's typed configuration, from its fields: name,
  type, default and meaning (the field's docstring, the one place an option is described);
- `stored formats`: every format durable-sinks stores (core/formats.py), the version this
  release writes, the versions it reads and where each is kept;
- `job options`: the job's options (`durable_sinks.spark.JobOptions`), likewise. Their
  docstrings' relative links are written as they read in docs/guide.md, and rewritten for a
  region in another file.

Besides, `unmatched_messages()` checks the messages docs/troubleshooting.md quotes against
those the code can raise or log (the comment above it says how).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import importlib
import inspect
import os
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import durable_sinks
from durable_sinks import sinks

ROOT = Path(__file__).resolve().parents[2]
#: Where regions may be: the README and every page of docs/.
FILES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
_REGION = re.compile(
    r"(<!-- reference: (?P<name>[a-z0-9 _-]+) -->\n)(?P<body>.*?)(<!-- /reference -->)", re.S
)


def _siblings(kind: str) -> list[str]:
    """The built-in kinds of `kind`'s package, `kind` first (`files` and `jsonl` share one)."""
    package = sinks.package_of(kind)
    return [kind, *(k for k in sinks.built_in() if k != kind and sinks.package_of(k) == package)]


def _page(kind: str) -> str:
    """The docs page of `kind`, relative to docs/: its own, else that of another kind of its
    package, else the guide to writing a sink."""
    pages = [f"{k}.md" for k in _siblings(kind) if (ROOT / "docs" / f"{k}.md").exists()]
    return pages[0] if pages else "writing-a-sink.md"


def _public_name(cls: type[Any]) -> str:
    if getattr(durable_sinks, cls.__name__, None) is cls:
        return f"durable_sinks.{cls.__name__}"
    package = cls.__module__.rsplit(".", 1)[0]
    return f"{package}.{cls.__name__}"


def _summary(kind: str) -> str:
    """The first sentence of the kind's package docstring (of its typed configuration's when
    the package holds several kinds), without its file references."""
    if len(_siblings(kind)) > 1:
        doc = inspect.getdoc(sinks.config_class_of(kind)) or ""
    else:
        doc = inspect.getdoc(importlib.import_module(sinks.package_of(kind))) or ""
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    sentence = re.split(r"(?<=[.])\s", paragraph, maxsplit=1)[0]
    sentence = re.sub(r"\s*\((?:docs/[^)]*|[a-z_]+\.py)\)", "", sentence)
    return _cell(sentence.rstrip("."))


def kinds_table(here: Path) -> str:
    docs = ROOT / "docs"
    prefix = "" if here.parent == docs else f"{docs.relative_to(here.parent).as_posix()}/"
    rows = [
        "| kind | typed configuration | install | what it does | page |",
        "|---|---|---|---|---|",
    ]
    for kind, extra in sinks.built_in().items():
        cls = sinks.config_class_of(kind)
        assert cls is not None, kind
        install = f"`pip install 'durable-sinks[{extra}]'`" if extra else "the base install"
        page = _page(kind)
        rows.append(
            f"| `{kind}` | `{_public_name(cls)}` | {install} | {_summary(kind)} | "
            f"[{page}]({prefix}{page}) |"
        )
    return "\n".join(rows) + "\n"


def field_docs(cls: type[Any]) -> dict[str, str]:
    """Each field's docstring (the string literal under it in the class body)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    found: dict[str, str] = {}
    for statement, following in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            found[statement.target.id] = inspect.cleandoc(following.value.value)
    return found


def _type(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin is Literal:
        return ", ".join(f"`{a!r}`".replace("'", '"') for a in args)
    if origin is tuple and args[1:] == (...,):
        return f"tuple of {_type(args[0])}"
    if (origin is not None and origin.__name__ == "Mapping") or origin is Mapping:
        return f"mapping of {_type(args[0])} to {_type(args[1])}"
    if annotation is type(None):
        return "`None`"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = ", ".join(f'`"{member.value}"`' for member in annotation)
        return f"{values} (or `{_public_name(annotation)}`)"
    if isinstance(annotation, type) and annotation.__module__.startswith("durable_sinks."):
        return f"`{_public_name(annotation)}`"
    if isinstance(annotation, type):
        return f"`{annotation.__name__}`"
    return f"`{annotation}`".replace("typing.", "")


def _default(f: dataclasses.Field[Any], group_digits: bool = False) -> str:
    """The default as it would be written: an enum member as its value, a dataclass made
    with its own defaults as `Name()`, and with `group_digits` an int of five digits or more
    with `_` between thousands."""
    if f.default is not dataclasses.MISSING:
        value = f.default
        if isinstance(value, enum.Enum):
            value = value.value
        if group_digits and type(value) is int and abs(value) >= 10_000:
            return f"`{value:_}`"
        return f"`{value!r}`".replace("'", '"')
    if f.default_factory is not dataclasses.MISSING:
        factory = f.default_factory
        if isinstance(factory, type) and dataclasses.is_dataclass(factory):
            return f"`{factory.__name__}()`"
        return f"`{factory()!r}`"
    return "required"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _fields_table(
    cls: type[Any], meaning_of: Callable[[str], str] = lambda text: text, group_digits: bool = False
) -> str:
    """The options table of a dataclass: each field given to its constructor, with its type,
    default (`_default`'s `group_digits`) and docstring (`meaning_of` applied)."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    rows = ["| option | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        meaning = docs.get(f.name)
        assert meaning, f"{cls.__name__}.{f.name} has no docstring: document it under the field"
        rows.append(
            f"| `{f.name}` | {_type(hints[f.name])} | {_default(f, group_digits)} | "
            f"{_cell(meaning_of(meaning))} |"
        )
    return "\n".join(rows) + "\n"


def options_table(kind: str) -> str:
    cls = sinks.config_class_of(kind)
    assert cls is not None, kind
    return _fields_table(cls)


GUIDE = ROOT / "docs" / "guide.md"
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def relink(text: str, here: Path) -> str:
    """`text`'s relative Markdown links, written as they read in docs/guide.md, as they must
    read in `here`: an anchor of its own becomes the guide's, a page path is made relative to
    `here`'s folder."""
    if here.resolve() == GUIDE:
        return text

    def moved(link: re.Match[str]) -> str:
        target = link["target"]
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not relative
            return link[0]
        if target.startswith("#"):
            target = GUIDE.name + target
        path, _, anchor = target.partition("#")
        path = os.path.relpath(GUIDE.parent / path, here.resolve().parent)
        return f"]({Path(path).as_posix()}{'#' + anchor if anchor else ''})"

    return _LINK.sub(moved, text)


def job_options_table(here: Path) -> str:
    from durable_sinks.spark import JobOptions

    return _fields_table(JobOptions, lambda text: relink(text, here), group_digits=True)


#: Where the installed package's modules live in the repository.
_PACKAGE_FOLDERS = {
    ROOT / "src" / "durable_sinks": "durable_sinks",
    ROOT / "sinks": "durable_sinks.sinks",
    ROOT / "coordinator": "durable_sinks.coordinator",
    ROOT / "manifest": "durable_sinks.manifest",
}


def _modules_saying(text: str) -> list[str]:
    """The package's modules whose source holds `text`, by import name."""
    found = []
    for folder, package in _PACKAGE_FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            if text in path.read_text():
                parts = path.relative_to(folder).with_suffix("").parts
                found.append(".".join((package, *parts)).removesuffix(".__init__"))
    return found


def stored_formats() -> list[Any]:
    """Every stored format: those declared with `stored_format(...)` (core/formats.py) and
    each sink's handle details (core/handles.py), the declarations first."""
    from durable_sinks.core.formats import STORED_FORMATS
    from durable_sinks.core.handles import HandleDetails

    for module in _modules_saying("stored_format("):
        importlib.import_module(module)
    details = []
    for module in _modules_saying("(HandleDetails)"):
        loaded = importlib.import_module(module)
        details += [
            value.stored_format()
            for value in vars(loaded).values()
            if isinstance(value, type)
            and issubclass(value, HandleDetails)
            and value is not HandleDetails
            and value.__module__ == module
        ]
    declared = sorted(STORED_FORMATS.values(), key=lambda f: f.name.lower())
    return [*declared, *sorted(details, key=lambda f: f.name.lower())]


def stored_formats_table() -> str:
    lines = ["| stored format | writes | reads | where, and where its version is kept |"]
    lines.append("|---|---|---|---|")
    for known in stored_formats():
        reads = ", ".join(str(v) for v in range(known.oldest, known.current + 1))
        lines.append(f"| {known.name} | {known.current} | {reads} | {_cell(known.where)} |")
    return "\n".join(lines) + "\n"


TABLES: dict[str, Callable[[list[str], Path], str]] = {
    "stored formats": lambda args, here: stored_formats_table(),
    "kinds": lambda args, here: kinds_table(here),
    "options": lambda args, here: options_table(args[0]),
    "job options": lambda args, here: job_options_table(here),
}


def generate(name: str, here: Path) -> str:
    """The table NAME: a table's name (`kinds`, `job options`), or one and its arguments
    (`options postgres`)."""
    if name in TABLES:
        return TABLES[name]([], here)
    table, *args = name.split()
    if table not in TABLES:
        raise KeyError(f"{here}: no reference table {table!r} (known: {sorted(TABLES)})")
    return TABLES[table](args, here)


def regions(text: str) -> Iterator[re.Match[str]]:
    return _REGION.finditer(text)


def render(path: Path) -> str:
    """`path`'s text with every region generated anew."""
    text = path.read_text()
    return _REGION.sub(lambda m: m.group(1) + generate(m["name"], path) + m.group(4), text)


def stale() -> list[str]:
    """`file: region` for every region whose text differs from what the code gives now."""
    found = []
    for path in FILES:
        text = path.read_text()
        for match in regions(text):
            if match["body"] != generate(match["name"], path):
                found.append(f"{path.relative_to(ROOT)}: {match['name']}")
    return found


# The troubleshooting page's messages against the messages the code can raise or log.
#
# The code's messages: every string literal of the package's source (src/, sinks/,
# coordinator/, manifest/; docstrings left out) as a template, in which an f-string's
# replacement field, an operand of `+` that is no literal and a `%s`-style placeholder are
# holes. The page's: each code span of a message cell (the first cell of a table headed
# `message starts with`, `message contains` or `error`), in which `…` and `<placeholder>`
# stand for values. Between them are its pieces; each piece (with three letters or more) must
# be a part of one template, a hole standing for a value the page spells out (a name, a
# number, a quoted or bracketed value) or for another template whose holes are values (a
# message made of parts: `f"{what}: {why}"`), and a word of three letters or more of it the
# code's own text, not a value. A changed word of the code's own text is found; a changed
# value is not (`postgres sink '…'` is as good as `kafka sink '…'`).
#
# Another program's words (Postgres's, librdkafka's, Spark's, Python's) are marked as such:
# the code span follows the program's name and `'s`, e.g. Postgres's `maximum number of
# prepared transactions reached` (or a list of them: Postgres's `a`, `b` or `c`). Such a span
# is not the code's: at least one of its pieces must match no template (the mark is for text
# the code does not produce).

#: The page whose quoted messages are checked, and the programs whose words it may quote.
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
OTHER_PROGRAMS = ("Postgres", "librdkafka", "Spark", "PySpark", "Python", "boto3", "delta-rs")
_SOURCES = ("src", "sinks", "coordinator", "manifest")
_HOLE, _SEP = "\x00", "\x01"
_PLACEHOLDER = re.compile(r"…|<[a-z][^<>`]*>")
_FORMAT_HOLE = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?[sdrfg]|\{\}")
_MESSAGE_HEADERS = ("message starts with", "message contains", "error")
_OTHERS = "|".join(re.escape(name) for name in OTHER_PROGRAMS)
_SPAN = re.compile(
    rf"(?:(?P<other>{_OTHERS})'s )?(?P<ticks>``?)(?!`)(?P<text>.+?)(?<!`)(?P=ticks)(?!`)"
)
_EDGES = " \t.,;:()/"
_TRIM = " \t.,;:'\"()[]{}"
_CLOSING = {"[": "]", "(": ")", "{": "}", "'": "'", '"': '"'}


def _template(node: ast.AST) -> str | None:
    """The string `node` evaluates to, each part that is not a literal a hole; None if it is
    no string expression."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _FORMAT_HOLE.sub(_HOLE, node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(
            _FORMAT_HOLE.sub(_HOLE, str(part.value)) if isinstance(part, ast.Constant) else _HOLE
            for part in node.values
        )
    if isinstance(node, ast.IfExp):  # `f"..." if c else ""`: the message as it reads with it
        return _template(node.body)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else _HOLE) + (right if right is not None else _HOLE)
    return None


@functools.cache
def code_messages() -> tuple[str, ...]:
    """Every string the package's source can put together, as a template (holes: `_HOLE`)."""
    found: set[str] = set()
    for folder in _SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            docstrings = {
                id(node.value)
                for node in ast.walk(tree)
                if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            }
            for node in ast.walk(tree):
                if id(node) not in docstrings and (text := _template(node)) is not None:
                    # Values side by side (`f"{a} {b}"`) are one value: a hole stands for
                    # one, and two holes in a row would take any two words of the page.
                    found.add(re.sub(f"{_HOLE}(?:[ \t]+{_HOLE})+", _HOLE, text))
    return tuple(sorted(found))


#: A value in a message: a quoted or bracketed one, a name with its detail in brackets
#: (`not_null (column 'id')`), or a run of non-blank characters (`?`: as few as fit).
_VALUE = r"""(?:'[^']*'|"[^"]*"|\[[^\]]*\]|\([^)]*\)|\w+ \([^)]*(?:\)|\Z)|\S*{})"""


#: The state of a match in which a word of the template's own text has been matched.
_WORD = 3


class _Matcher:
    """Whether a piece of text is part of one of the code's templates: a bit-parallel run
    over all of them at once (bit j set: "the piece so far may end before character j").

    A hole of the template stands for a value (a run of non-blank characters, a quoted or
    bracketed value) or for a whole other template (a message made of parts: `f"{what}:
    {why}"` with `what = f"the producer settings are refused by {client}"`), whose own holes
    stand for values."""

    def __init__(self, templates: tuple[str, ...]) -> None:
        text = _SEP + _SEP.join(templates) + _SEP
        self.at: dict[str, int] = {}
        for j, char in enumerate(text):
            self.at[char] = self.at.get(char, 0) | (1 << j)
        self.holes = self.at[_HOLE]
        self.anywhere = ((1 << len(text)) - 1) & ~self.at[_SEP]
        #: The templates a hole may hold (those of two words or more), each with its texts
        #: between holes (a piece holds a part of the template only if it holds one).
        self.parts = [
            (texts, template)
            for template in templates
            if len(re.findall(r"[A-Za-z]{2,}", template)) >= 2
            for texts in [tuple({t.strip(_TRIM) for t in template.split(_HOLE)} - {""})]
        ]

    @staticmethod
    @functools.cache
    def _part(template: str, start: int = 0) -> tuple[re.Pattern[str], ...]:
        """`template` from its `start`th text on as patterns, each hole a value (a group; as
        short, then as long, as fits), which may also end where the piece ends, before a hole
        (the piece's `…`)."""
        texts = template.split(_HOLE)

        def pattern(k: int, lazy: str) -> str:
            text = texts[k].lstrip() if k == start > 0 else texts[k]  # after a hole: a word
            head = text.rstrip(_TRIM)
            rest = re.escape(text[len(head) :])
            if k == len(texts) - 1:
                return re.escape(head) + rest
            value = _VALUE.format(lazy)
            return rf"{re.escape(head)}(?:\Z|{rest}({value}){pattern(k + 1, lazy)})"

        return tuple(re.compile(pattern(start, lazy)) for lazy in ("?", ""))

    @staticmethod
    def _value_ends(piece: str, i: int) -> set[int]:
        """Where a value starting at piece[i] may end: after a run of non-blank characters,
        or a quoted or bracketed value."""
        ends = set()
        k = i
        while k < len(piece) and not piece[k].isspace():
            k += 1
            ends.add(k)
        close = _CLOSING.get(piece[i])
        if close is not None and (k := piece.find(close, i + 1)) > 0:
            ends.add(k + 1)
        return ends

    def _part_ends(self, piece: str, i: int, parts: list[str]) -> dict[int, bool]:
        """Where one of `parts` starting at piece[i] may end (at the piece's start, a part
        may also be entered after one of its holes), and whether a word of three letters or
        more of it is its text, not its values."""
        ends: dict[int, bool] = {}
        for template in parts:
            for start in range(template.count(_HOLE) + 1 if i == 0 else 1):
                for pattern in self._part(template, start):
                    found = pattern.match(piece, i)
                    if found is None or found.end() == i:
                        continue
                    text, at = [], found.start()
                    for begin, end in found.regs[1:]:
                        if begin >= 0:
                            text.append(piece[at:begin])
                            at = max(at, end)
                    text.append(piece[at : found.end()])
                    worded = any(re.search(r"[A-Za-z]{3}", t) for t in text)
                    ends[found.end()] = ends.get(found.end(), False) or worded
        return ends

    def __call__(self, piece: str) -> bool:
        """`piece` is part of one template, a word of three letters or more of it text of
        the code (of the template, or of a part put into one of its holes), not a value."""
        n = len(piece)
        parts = [t for texts, t in self.parts if any(text in piece for text in texts)]
        # states[i][run]: where piece[:i] may end, with `run` letters in a row of the
        # template's text just matched (0-2), or WORD: a word of three already matched.
        states = [[0] * 4 for _ in range(n + 1)]
        states[0][0] = self.anywhere
        for i in range(n + 1):
            here = states[i]
            for run in range(4):
                before = -1
                while here[run] != before:  # a hole may stand for nothing
                    before = here[run]
                    here[run] |= (here[run] & self.holes) << 1
            if i == n:
                break
            same = self.at.get(piece[i], 0)
            after = states[i + 1]
            for run, at in enumerate(here):
                grown = (at & same) << 1
                if run == _WORD:
                    after[_WORD] |= grown
                elif piece[i].isalpha():
                    after[run + 1] |= grown  # 2 + 1 is _WORD
                else:
                    after[0] |= grown
            if any(at & self.holes for at in here):
                ends = dict.fromkeys(self._value_ends(piece, i), False)
                for k, worded in self._part_ends(piece, i, parts).items():
                    ends[k] = ends.get(k, False) or worded
                for k, worded in ends.items():
                    for run, at in enumerate(here):
                        states[k][_WORD if worded or run == _WORD else 0] |= (at & self.holes) << 1
        return bool(states[n][_WORD])


@functools.cache
def _matcher() -> _Matcher:
    return _Matcher(code_messages())


def pieces(message: str) -> list[str]:
    """The pieces of a quoted message that are checked: the text between its `…` and
    `<placeholder>`s, without the quotes or brackets around those (`'…'`, `[…]`: part of the
    value) and trimmed of blanks and `.,;:` at the ends; only those with a word of three
    letters or more."""
    found = []
    split = _PLACEHOLDER.split(message)
    for i, piece in enumerate(split):
        if i > 0 and piece[:1] in _CLOSING.values():
            piece = piece[1:]
        if i < len(split) - 1 and piece[-1:] in _CLOSING:
            piece = piece[:-1]
        piece = piece.strip(_EDGES)
        if re.search(r"[A-Za-z]{3}", piece):
            found.append(piece)
    return found


def quoted_messages(text: str) -> Iterator[tuple[int, str | None, str]]:
    """(line number, other program or None, message) for each code span of a message cell."""
    checked = False
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            checked = False
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if set(cells[0]) <= set("-"):
            continue
        if cells[0] in _MESSAGE_HEADERS:
            checked = True
            continue
        if checked:
            other, end = None, 0
            for span in _SPAN.finditer(cells[0]):
                # Postgres's `a`, `b` or `c`: the mark holds for a list of quotes.
                listed = cells[0][end : span.start()] in (", ", " or ", ", or ")
                other = span["other"] or (other if listed else None)
                end = span.end()
                yield number, other, span["text"].strip()


def unmatched_messages(path: Path = TROUBLESHOOTING) -> list[str]:
    """`page:line: piece (in message)` for each piece of the code's own messages that no
    template has, and `page:line: ...` for each other program's quote the code itself makes."""
    match = _matcher()
    found: list[str] = []
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    for number, other, message in quoted_messages(path.read_text()):
        where = f"{shown}:{number}"
        checked = pieces(message)
        if other is None:
            found.extend(
                f"{where}: {piece!r} is in no message of the code (quoted: {message!r})"
                for piece in checked
                if not match(piece)
            )
        elif checked and all(match(piece) for piece in checked):
            found.append(
                f"{where}: {other}'s {message!r} is the code's own message: quote it without "
                f'"{other}\'s"'
            )
    return found


def main() -> int:
    for path in FILES:
        text = path.read_text()
        new = render(path)
        if new != text:
            path.write_text(new)
            print(f"rewrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
