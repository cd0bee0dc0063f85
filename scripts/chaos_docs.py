"""Draw the chaos suite's tables in docs/explanation/chaos.md from the results the docs keep.

``make chaos`` writes ``.chaos/<executor>.json`` (and the same report as ``.md``); ``make soak``
writes ``.chaos/soak-<executor>.json`` and its curves ``.png``. The docs keep the runs they show in
``docs/chaos/``. This writes each run's tables into the page, between its markers
(``<!-- chaos-table: celery -->`` ... ``<!-- /chaos-table -->``), so a test can check that every
table was drawn from the data kept, never typed by hand:

    python scripts/chaos_docs.py                          # redraw from docs/chaos/*.json
    python scripts/chaos_docs.py .chaos/celery.json ...   # take new results (a soak's curves too), then redraw
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEPT = ROOT / "docs" / "chaos"
PAGE = ROOT / "docs" / "explanation" / "chaos.md"
MARKER = re.compile(r"(<!-- chaos-table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /chaos-table -->)", re.S)
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def table(name: str) -> str:
    """The tables of the kept run ``name`` (``celery``, ``local``, ``soak-celery``...)."""
    from support.chaos import report, soak

    data: dict[str, Any] = json.loads((KEPT / f"{name}.json").read_text())
    if name.startswith("soak-"):
        return soak.markdown(data)
    return report.markdown(data)


def page_with_tables(text: str) -> str:
    """The page with every marked table redrawn from its kept run."""
    return MARKER.sub(lambda m: f"{m[1]}\n{table(m['name'])}\n\n{m[4]}", text)


def main(argv: list[str]) -> int:
    KEPT.mkdir(parents=True, exist_ok=True)
    for new in map(Path, argv):
        shutil.copyfile(new, KEPT / new.name)
        if (curves := new.with_suffix(".png")).exists():
            shutil.copyfile(curves, KEPT / curves.name)
        print(f"kept {new} in {KEPT.relative_to(ROOT)}/")
    text = PAGE.read_text()
    PAGE.write_text(page_with_tables(text))
    print(f"redrew the tables of {PAGE.relative_to(ROOT)}: {', '.join(m['name'] for m in MARKER.finditer(text))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
