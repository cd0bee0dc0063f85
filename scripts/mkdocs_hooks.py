"""MkDocs hooks for the docs site (mkdocs.yml's ``hooks``).

The pages are written for GitHub and for the site alike. One difference between the two Markdown
readers needs a hand: in a table, GitHub wants a ``|`` inside a code span escaped as ``\\|`` and
shows it without the backslash, while Python-Markdown already leaves a code span's ``|`` alone and
would show the backslash. The generated tables (argument tables) keep GitHub's form; the site gets
the plain pipe.
"""

from __future__ import annotations

import re
from typing import Any

CODE = re.compile(r"`[^`\n]*`")


def unescape_table_pipes(markdown: str) -> str:
    """``\\|`` inside the code spans of table rows, as ``|``."""
    return "\n".join(
        CODE.sub(lambda m: m.group(0).replace("\\|", "|"), line) if line.startswith("|") else line
        for line in markdown.split("\n")
    )


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return unescape_table_pipes(markdown)
