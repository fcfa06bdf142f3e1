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
  type, default and meaning (the field's docstring, the one place an option is described).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
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
    if isinstance(annotation, type):
        return f"`{annotation.__name__}`"
    return f"`{annotation}`".replace("typing.", "")


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{f.default!r}`".replace("'", '"')
    if f.default_factory is not dataclasses.MISSING:
        return f"`{f.default_factory()!r}`"
    return "required"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def options_table(kind: str) -> str:
    cls = sinks.config_class_of(kind)
    assert cls is not None, kind
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    rows = ["| option | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        meaning = docs.get(f.name)
        assert meaning, f"{cls.__name__}.{f.name} has no docstring: document it under the field"
        rows.append(f"| `{f.name}` | {_type(hints[f.name])} | {_default(f)} | {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


TABLES: dict[str, Callable[[list[str], Path], str]] = {
    "kinds": lambda args, here: kinds_table(here),
    "options": lambda args, here: options_table(args[0]),
}


def generate(name: str, here: Path) -> str:
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
