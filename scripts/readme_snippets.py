"""Keep the code snippets of the README and the docs pages equal to the example DAGs they quote.

In README.md and every page under docs/, a snippet is a ```python block right after a line
``<!-- snippet: dags/FILE.py#NAME -->``; its text is the part of FILE.py between
``# [START NAME]`` and ``# [END NAME]``, dedented.

    python scripts/readme_snippets.py          # check: exit 1 and list what differs
    python scripts/readme_snippets.py --write  # rewrite the snippets from the DAGs
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SNIPPET = re.compile(r"(<!-- snippet: (?P<path>[^#\s]+)#(?P<name>[\w-]+) -->\n```python\n)(?P<body>.*?)(```)", re.S)


def pages() -> list[Path]:
    """The README and every Markdown page of the docs site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def marked(path: Path, name: str) -> str:
    text = path.read_text()
    match = re.search(rf"^[ \t]*# \[START {re.escape(name)}\]\n(.*?)^[ \t]*# \[END {re.escape(name)}\]", text, re.S | re.M)
    if not match:
        raise LookupError(f"{path.relative_to(ROOT)} has no [START {name}] ... [END {name}]")
    return textwrap.dedent(match.group(1))


def render(page: str) -> tuple[str, list[str]]:
    stale: list[str] = []

    def replace(m: re.Match[str]) -> str:
        body = marked(ROOT / m["path"], m["name"])
        if body != m["body"]:
            stale.append(f"{m['path']}#{m['name']}")
        return m.group(1) + body + m.group(5)

    return SNIPPET.sub(replace, page), stale


def main() -> int:
    failed = False
    for path in pages():
        text = path.read_text()
        new, stale = render(text)
        if "--write" in sys.argv:
            if new != text:
                path.write_text(new)
            continue
        for name in stale:
            failed = True
            print(f"{path.relative_to(ROOT)}: snippet {name} differs from the DAG; run: python scripts/readme_snippets.py --write")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
