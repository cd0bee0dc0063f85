"""Draw the chaos suite's tables in docs/explanation/chaos.md from the results the docs keep.

``make chaos`` writes ``.chaos/<executor>.json`` (and the same report as ``.md``); ``make soak``
writes ``.chaos/soak-<executor>.json`` and its curves ``.png``. The docs keep the runs they show in
``docs/chaos/``. This writes each run's tables into the page, between its markers
(``<!-- chaos-table: celery -->`` ... ``<!-- /chaos-table -->``), so a test can check that every
table was drawn from the data kept, never typed by hand:

    python scripts/chaos_docs.py                          # redraw from docs/chaos/*.json
    python scripts/chaos_docs.py .chaos/celery.json ...   # take new results (a soak's curves too), then redraw

Results of one executor made by runs side by side (``make chaos ... FIRST=<seed> REDIS_DB=<n>
OUT=<folder>``) are kept as one run: ``python scripts/chaos_docs.py .chaos/celery.json more/celery.json`` keeps
every trial of both (never one file's trials in place of the other's), their minutes the longer run's.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections import Counter
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


def merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs of one executor made side by side, as one: every trial of each; a seed in two runs is refused."""
    if any("samples" in run for run in runs):
        raise SystemExit("a soak's samples are one deployment's over time: keep one soak, never two merged")
    first, *rest = runs
    for other in rest:
        if (other["executor"], other["skipped"], other["replay"]) != (first["executor"], first["skipped"], first["replay"]):
            raise SystemExit("these runs differ in executor, skipped faults or fault kinds: keep them apart")
    if twice := sorted(seed for seed, n in Counter(t["seed"] for run in runs for t in run["trials"]).items() if n > 1):
        raise SystemExit(f"a seed ran in two of these runs: {twice}")
    trials = sorted((t for run in runs for t in run["trials"]), key=lambda t: t["seed"])
    return {**first, "minutes": max(run["minutes"] for run in runs), "trials": trials}


def main(argv: list[str]) -> int:
    KEPT.mkdir(parents=True, exist_ok=True)
    by_name: dict[str, list[Path]] = {}
    for new in map(Path, argv):
        by_name.setdefault(new.name, []).append(new)
    for name, news in by_name.items():
        if len(news) > 1:
            runs = [json.loads(new.read_text()) for new in news]
            (KEPT / name).write_text(json.dumps(merged(runs), indent=1) + "\n")
        else:
            shutil.copyfile(news[0], KEPT / name)
        for new in news:
            if (curves := new.with_suffix(".png")).exists():
                shutil.copyfile(curves, KEPT / curves.name)
        print(f"kept {' + '.join(map(str, news))} in {KEPT.relative_to(ROOT)}/{name}")
    text = PAGE.read_text()
    PAGE.write_text(page_with_tables(text))
    print(f"redrew the tables of {PAGE.relative_to(ROOT)}: {', '.join(m['name'] for m in MARKER.finditer(text))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
