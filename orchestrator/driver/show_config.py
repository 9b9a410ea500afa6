"""``python -m orchestrator.main --print-config [--config FILE] [overrides]``: the resolved config.

The tree the run would start with, as YAML a config file can hold: every setting with its value
(what the file and overrides did not set is the default), a ``# default: X`` where the value is
not the default, and each setting's one-line doc. The docs are the config dataclasses' attribute
docstrings (the string under a field), read from their source, so a setting documented where it
is declared is documented here with no second copy to keep in step.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import re
import textwrap
from typing import Any

import yaml

from orchestrator.config import RunConfig
from orchestrator.shared import configtools

DOC_CHARS = 110
"""A doc longer than this is cut (with …): one line each, the whole text is in the source."""
COMMENT_COLUMN = 44
"""Where the ``#`` of a setting's comment goes when its ``key: value`` is shorter."""


def render(cfg: RunConfig) -> str:
    """The resolved ``cfg`` as commented YAML (values, differing defaults, docs)."""
    lines = ["# The resolved config (python -m orchestrator.main --print-config): every setting,",
             "# its one-line doc, and `default: X` where the value is not the default."]
    _section(cfg, configtools.to_dict(RunConfig()), 0, lines)
    return "\n".join(lines)


def _section(obj: Any, default: Any, depth: int, lines: list[str]) -> None:
    """The fields of dataclass ``obj`` at ``depth``, each with its doc and default."""
    docs = field_docs(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        dflt = default.get(f.name, _MISSING) if isinstance(default, dict) else _MISSING
        doc = docs.get(f.name, "")
        indent = "  " * depth
        if dataclasses.is_dataclass(value):
            lines.append(_with_comment(f"{indent}{f.name}:", doc or class_doc(type(value))))
            _section(value, dflt, depth + 1, lines)
            continue
        plain = configtools.to_dict(value)
        text = f"{indent}{f.name}: {_scalar(plain)}"
        note = "" if dflt is _MISSING or dflt == plain else f"default: {_scalar(dflt)}"
        lines.append(_with_comment(text, "; ".join(x for x in (note, doc) if x)))


_MISSING = object()
_NOT_AN_END = ("e.g", "i.e", "cf", "vs")
"""A period after these is no sentence's end."""


def _scalar(value: Any) -> str:
    """One value in YAML flow style (``[a, b]``, ``{k: v}``, ``null``, ``'auto'``...)."""
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip().removesuffix(
        "\n...").removesuffix("...").strip()


def _with_comment(text: str, comment: str) -> str:
    if not comment:
        return text
    return f"{text.ljust(COMMENT_COLUMN - 1)} # {comment}"


def class_doc(cls: type) -> str:
    """The first line of ``cls``'s own docstring ("" for the signature dataclass writes)."""
    doc = cls.__doc__ or ""
    return "" if doc.startswith(f"{cls.__name__}(") else _first_line(doc)


def _first_line(doc: str) -> str:
    """The doc's first sentence, on one line, cut at ``DOC_CHARS``."""
    flat = " ".join(doc.replace("``", "`").split())
    ends = (m.start() for m in re.finditer(r"\. ", flat)
            if not flat[:m.start()].endswith(_NOT_AN_END))
    end = next(ends, -1)
    line = flat[:end + 1] if end >= 0 else flat
    return line if len(line) <= DOC_CHARS else line[:DOC_CHARS - 1].rstrip() + "…"


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: one-line doc}`` from the attribute docstrings in ``cls``'s source (and its
    dataclass bases'); a field without one is left out."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # no source (built in, frozen): no docs
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, after in itertools.pairwise(body):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[stmt.target.id] = _first_line(after.value.value)
    return docs
