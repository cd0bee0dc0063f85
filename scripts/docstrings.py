"""A griffe extension for the docs site's API reference (mkdocs.yml loads it).

The package's docstrings are Google style with reStructuredText inline markup, which also reads
well in ``help()``: Sphinx roles (``:class:`~airflow_resumable.core.model.errors.Cancelled```) and
literal blocks (``::`` or ``.. code-block:: python`` before an indented block). Markdown has
neither, so this turns roles into code spans (``~`` keeps the last name, as Sphinx shows it) and
literal blocks into fenced code, leaving the docstrings themselves alone.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj|const|py:\w+):`(?P<text>[^`]+)`")


def _role(match: re.Match[str]) -> str:
    text = match["text"]
    explicit = re.fullmatch(r"(.+?)\s*<[^>]+>", text)
    if explicit:
        text = explicit.group(1)
    elif text.startswith("~"):
        text = text[1:].rsplit(".", 1)[-1]
    return f"`{text}`"


def markdown(doc: str) -> str:
    """The docstring with its reStructuredText roles and literal blocks in Markdown."""
    doc = ROLE.sub(_role, doc)
    lines = doc.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = re.fullmatch(r"(\s*)\.\. code-block::\s*(\w*)\s*", line)
        literal = not directive and line.rstrip().endswith("::") and not line.strip().startswith("..")
        if not (directive or literal):
            out.append(line)
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        if directive:
            lang = directive.group(2) or "python"
        else:
            lang = "python"
            text = line.rstrip()[:-1]  # "Example::" reads "Example:"; a lone "::" disappears
            if text.strip() != ":":
                out.append(text)
        i += 1
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
            block.append(lines[i])
            i += 1
        while block and not block[-1].strip():
            block.pop()
        body = [b for b in block if b.strip()]
        if not body:
            continue
        strip = min(len(b) - len(b.lstrip()) for b in body)
        pad = " " * indent
        first = next(n for n, b in enumerate(block) if b.strip())  # the blank line after "::" is not code
        code = [pad + b[strip:] if b.strip() else "" for b in block[first:]]
        out += ["", f"{pad}```{lang}", *code, f"{pad}```", ""]
    return "\n".join(out)


class ReStructuredTextToMarkdown(Extension):
    """Rewrite every docstring for Markdown once the object tree is complete."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
