"""Draw the benchmark table and plots of docs/benchmarks.md from ``make bench``'s results.

``make bench`` writes ``.bench/results.json`` (``run``: the lines saying when, where and on what
it ran; ``rows``: one object a row: key, what, measured, ratio, spread, target, passed, verdict,
notes); the docs keep the run they show as ``docs/bench/results.json``. This writes the table of
docs/benchmarks.md (between its ``bench-table`` markers) and one SVG a plot beside the data, by
hand (no plotting library: the files are small, the same for the same data, and a test checks
that the table and the plots were drawn from the data kept):

    python scripts/bench_plots.py                      # redraw from docs/bench/results.json
    python scripts/bench_plots.py .bench/results.json  # take a new run's results, then redraw
"""

from __future__ import annotations

import math
import re
import shutil
import sys
from html import escape
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "docs" / "bench"
WIDTH, LABEL, ROW, TOP, RIGHT = 760, 360, 28, 46, 90
PASS, MISS, NEUTRAL, INK = "#2e7d32", "#c62828", "#607d8b", "#263238"


PAGE = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench-table: drawn by scripts/bench_plots.py -->", "<!-- /bench-table -->"


def target_value(target: str) -> tuple[str, float] | None:
    """``("<=", 1.25)`` for ``"<= 1.25x"`` or ``"≤ 1.25x"``; None for a target that is not a ratio."""
    match = re.fullmatch(r"\s*(≤|<=|<|≥|>=|>)\s*(\d+(?:\.\d+)?)x(?: each)?\s*", target)
    if not match:
        return None
    return ("<=" if match[1] in ("≤", "<=", "<") else ">="), float(match[2])


def load(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """(the run's header lines, its rows) from a results file."""
    import json

    data = json.loads(path.read_text())
    if isinstance(data, list):  # a file written before the header was kept
        return [], data
    return list(data["run"]), list(data["rows"])


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def markdown(run: list[str], rows: list[dict[str, Any]]) -> str:
    """The run's table as the docs show it: its header lines, then a row a result."""
    verdicts = {"PASS": "pass", "MISS": "**miss**", "ERROR": "**error**"}
    out = [f"{line}  " for line in run[:-1]] + run[-1:] + [""] if run else []
    out += ["| # | what | measured (medians) | ratio | spread | target | |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        target = str(r["target"]).replace("<=", "≤").replace(">=", "≥")
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        spread = "" if r.get("spread") in (None, "-") else r["spread"]
        out.append("| " + " | ".join(_cell(c) for c in (r["key"], r["what"], r["measured"], ratio, spread, target,
                                                         verdicts.get(r["verdict"], ""))) + " |")
    return "\n".join(out)


def page_with_table(text: str, table: str) -> str:
    """``text`` (docs/benchmarks.md) with the table between its markers replaced by ``table``."""
    head, found, rest = text.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    assert found and found_end, f"docs/benchmarks.md lost its markers {BEGIN} ... {END}"
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def _target(row: dict[str, Any]) -> tuple[str, float]:
    found = target_value(row["target"])
    assert found is not None, row["key"]
    return found


def _label(row: dict[str, Any]) -> str:
    what = row["what"].replace("`", "")
    return f'{row["key"]}  {what[:52] + "…" if len(what) > 53 else what}'


def bars(title: str, rows: list[dict[str, Any]], *, log: bool, note: str) -> str:
    """A horizontal bar a row (its ratio), with its target as a tick; green met, red missed."""
    height = TOP + ROW * len(rows) + 40
    values = [v for r in rows for v in (r["ratio"], _target(r)[1])]
    low, high = (min(values) / 1.5, max(values) * 1.5) if log else (0.0, max(values) * 1.12)

    def x(value: float) -> float:
        span = WIDTH - LABEL - RIGHT
        if log:
            return LABEL + span * (math.log10(value) - math.log10(low)) / (math.log10(high) - math.log10(low))
        return LABEL + span * (value - low) / (high - low)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        f'font-family="sans-serif" font-size="12" role="img" aria-label="{escape(title)}">',
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
        f'<text x="10" y="20" font-size="15" font-weight="bold" fill="{INK}">{escape(title)}</text>',
        f'<text x="10" y="36" fill="{NEUTRAL}">{escape(note)}</text>',
    ]
    base = x(1.0) if log else x(0.0)
    if log or low <= 1.0 <= high:
        one = x(1.0)
        out.append(f'<line x1="{one:.1f}" y1="{TOP - 4}" x2="{one:.1f}" y2="{TOP + ROW * len(rows)}" '
                   f'stroke="{NEUTRAL}" stroke-dasharray="3,3"/>')
        out.append(f'<text x="{one:.1f}" y="{TOP + ROW * len(rows) + 14}" text-anchor="middle" fill="{NEUTRAL}">1x</text>')
    for n, row in enumerate(rows):
        y = TOP + ROW * n
        ratio = row["ratio"]
        _, target = _target(row)
        color = PASS if row["passed"] else MISS if row["passed"] is False else NEUTRAL
        left, right = sorted((base, x(ratio)))
        out.append(f'<g><title>{escape(row["key"] + ": " + row["what"] + " — " + row["measured"])}</title>')
        out.append(f'<text x="{LABEL - 8}" y="{y + 17}" text-anchor="end" fill="{INK}">{escape(_label(row))}</text>')
        out.append(f'<rect x="{left:.1f}" y="{y + 5}" width="{max(right - left, 1):.1f}" height="{ROW - 10}" fill="{color}"/>')
        out.append(f'<line x1="{x(target):.1f}" y1="{y + 1}" x2="{x(target):.1f}" y2="{y + ROW - 1}" stroke="{INK}" stroke-width="2"/>')
        out.append(f'<text x="{max(right, x(target)) + 6:.1f}" y="{y + 17}" fill="{INK}">{ratio:g}x ({escape(row["target"])})</text>')
        out.append("</g>")
    out.append(f'<text x="{LABEL}" y="{height - 8}" fill="{NEUTRAL}">bar: measured ratio; black tick: target; '
               f'green: met, red: missed{"; log scale" if log else ""}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def plots(results: list[dict[str, Any]]) -> dict[str, str]:
    """Each plot's file name and SVG text, from the rows of one ``make bench`` run."""
    judged = [r for r in results if r.get("ratio") is not None and target_value(r["target"])]
    costs = [r for r in judged if _target(r)[0] == "<="]
    gains = [r for r in judged if _target(r)[0] == ">="]
    return {
        "ratios.svg": bars("Ratios judged against a ceiling", costs, log=False,
                           note="lower is better: ours vs the bare alternative (13: the longest unrenewed gap vs the lease), side by side in one run"),
        "speedups.svg": bars("Ratios judged against a floor", gains, log=True,
                             note="higher is better (row 10: the lowest of its four concurrency levels)"),
    }


def main() -> int:
    if len(sys.argv) > 1:
        shutil.copyfile(sys.argv[1], BENCH / "results.json")
    run, results = load(BENCH / "results.json")
    for name, svg in plots(results).items():
        (BENCH / name).write_text(svg)
        print(f"docs/bench/{name}")
    PAGE.write_text(page_with_table(PAGE.read_text(), markdown(run, results)))
    print("docs/benchmarks.md (its table)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
