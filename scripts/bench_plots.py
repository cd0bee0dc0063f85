"""Draw the benchmark table and plots of docs/benchmarks.md from ``make bench``'s results.

``make bench`` writes ``.bench/results.json`` (``run``: the lines saying when, where and on what
it ran; ``rows``: one object a row: key, what, measured, ratio, spread, target, passed, verdict,
notes); the docs keep the run they show as ``docs/bench/results.json``. This writes the table of
docs/benchmarks.md (between its ``bench-table`` markers) and one SVG a plot beside the data, drawn
by matplotlib (the ``docs`` extra): each judged row's ratio as a bar with its target, on an axis,
with a legend. The SVG keeps its text as text (searchable, and a test reads it: every row of the
data and nothing else, each value as the table prints it) and is the same for the same data and
matplotlib (no date, a fixed id salt).

    python scripts/bench_plots.py                      # redraw from docs/bench/results.json
    python scripts/bench_plots.py .bench/results.json  # take a new run's results, then redraw
    python scripts/bench_plots.py --merge .bench/results.json  # a run of some rows (--only): put its
                                                               # rows in the kept run's, then redraw

A merged run's rows replace the kept rows with the same keys (new keys go at the end), and the
header says which rows were measured apart, when and on what.
"""

from __future__ import annotations

import io
import math
import re
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "docs" / "bench"
PASS, MISS, NEUTRAL, INK = "#2e7d32", "#c62828", "#78909c", "#263238"
#: A row's label: its key and what it measures, wrapped to lines of this many characters.
LABEL_WIDTH = 44


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


def ratio_text(ratio: float) -> str:
    """A ratio as the table and the plots print it: two significant figures below 1, three from 1
    on, trailing zeros kept (``0.92x``, ``1.10x``, ``22.7x``, ``150x``)."""
    if ratio == 0:
        return "0x"
    magnitude = math.floor(math.log10(abs(ratio)))
    decimals = max(0, (1 if abs(ratio) < 1 else 2) - magnitude)
    return f"{ratio:.{decimals}f}x"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def markdown(run: list[str], rows: list[dict[str, Any]]) -> str:
    """The run's table as the docs show it: its header lines, then a row a result."""
    verdicts = {"PASS": "pass", "MISS": "**miss**", "ERROR": "**error**"}
    out = [f"{line}  " for line in run[:-1]] + run[-1:] + [""] if run else []
    # The verdict, the ratio and its target first: they stay in view on a narrow screen (the
    # table scrolls sideways from the right).
    out += ["| # | verdict | ratio | target | what | measured (medians) | spread |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        target = str(r["target"]).replace("<=", "≤").replace(">=", "≥")
        ratio = "" if r["ratio"] is None else ratio_text(r["ratio"])
        spread = "" if r.get("spread") in (None, "-") else r["spread"]
        out.append("| " + " | ".join(_cell(c) for c in (r["key"], verdicts.get(r["verdict"], ""), ratio, target,
                                                         r["what"], r["measured"], spread)) + " |")
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


def label(row: dict[str, Any]) -> str:
    """A row's label on a plot: its key and what it measures, whole, wrapped."""
    return "\n".join(textwrap.wrap(f"{row['key']}  {row['what'].replace('`', '')}", LABEL_WIDTH))


def subtitle_lines(subtitle: str) -> list[str]:
    """A plot's subtitle, wrapped to the figure's width."""
    return textwrap.wrap(subtitle, 100)


def bars(title: str, subtitle: str, rows: list[dict[str, Any]], *, log: bool, axis: str) -> str:
    """A horizontal bar a row (its ratio, its value at its end), its target as a black tick; green
    where the target was met, red where it was missed; the 1x line dashed. Returns the SVG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    plt.rcParams.update({"svg.hashsalt": "airflow-resumable-bench", "svg.fonttype": "none", "font.size": 10,
                         "font.family": "DejaVu Sans"})
    labels = [label(r) for r in rows]
    # Inches: the title and subtitle above, the axis and the legend below, a row of two lines each.
    width, top, bottom, row, left = 8.5, 1.0, 1.05, 0.46, 3.6
    height = top + bottom + row * len(rows)
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((left / width, bottom / height, 1 - (left + 0.25) / width, row * len(rows) / height))
    y = list(range(len(rows)))[::-1]
    values = [r["ratio"] for r in rows]
    targets = [_target(r)[1] for r in rows]
    colors = [PASS if r["passed"] else MISS if r["passed"] is False else NEUTRAL for r in rows]
    base = 1.0 if log else 0.0
    for yy, row, value, color in zip(y, rows, values, colors, strict=True):
        bar = ax.barh(yy, value - base, left=base, height=0.6, color=color)
        bar.patches[0].set_gid(f"bar-{row['key']}")
    ax.scatter(targets, y, marker="|", s=500, linewidths=2.5, color=INK, zorder=3)
    ax.axvline(1.0, color=NEUTRAL, linestyle="--", linewidth=1)
    if log:
        ax.set_xscale("log")
        low, high = min(values + targets) / 1.6, max(values + targets) * 2.2
        ticks = [t for t in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if low <= t <= high]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
    else:
        low, high = 0.0, max(values + targets) * 1.22
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}x"))
    ax.set_xlim(low, high)
    for yy, value, target in zip(y, values, targets, strict=True):
        end = max(value, target, base)  # right of the bar, its target and the 1x line
        ax.text(end * 1.06 if log else end + (high - low) * 0.012, yy, ratio_text(value), va="center", color=INK)
    ax.set_yticks(y, labels)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel(axis)
    ax.grid(axis="x", color="#eceff1")
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.text(0.1 / width, 1 - 0.12 / height, title, fontsize=13, fontweight="bold", color=INK, va="top")
    fig.text(0.1 / width, 1 - 0.42 / height, "\n".join(subtitle_lines(subtitle)), color=NEUTRAL,
             fontsize=9.5, va="top")
    fig.legend(handles=[Patch(color=PASS, label="target met"), Patch(color=MISS, label="target missed"),
                       Line2D([], [], color=INK, marker="|", linestyle="", markersize=14, markeredgewidth=2.5,
                              label="the row's target"),
                       Line2D([], [], color=NEUTRAL, linestyle="--", label="1x")],
               loc="lower center", bbox_to_anchor=(0.5, 0.02 / height), ncol=4, frameon=False,
               fontsize=9)
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)
    return out.getvalue()


def plots(results: list[dict[str, Any]]) -> dict[str, str]:
    """Each plot's file name and SVG text, from the rows of one ``make bench`` run."""
    return {name: bars(title, subtitle, rows, log=log, axis=axis)
            for name, (title, subtitle, rows, log, axis) in plotted(results).items()}


def plotted(results: list[dict[str, Any]]) -> dict[str, tuple[str, str, list[dict[str, Any]], bool, str]]:
    """What each plot shows: its title, subtitle, rows (those judged against a ratio), scale, axis."""
    judged = [r for r in results if r.get("ratio") is not None and target_value(r["target"])]
    costs = [r for r in judged if _target(r)[0] == "<="]
    gains = [r for r in judged if _target(r)[0] == ">="]
    return {
        "ratios.svg": ("Ratios judged against a ceiling (lower is better)",
                       "ours over the bare alternative, measured side by side in one run; each bar must end left of "
                       "its target", costs, False, "ratio: ours / the alternative"),
        "speedups.svg": ("Ratios judged against a floor (higher is better)",
                         "2a: the seed's OFFSET loop over ours; 10.x: our checkpoints/s over bare upserts at 1 to 64 "
                         "concurrent attempts; 15b: our partitions' speed-up over a hand split's on 4 workers; each "
                         "bar must end right of its target", gains, True,
                         "ratio (log scale)"),
    }


def merged(kept: tuple[list[str], list[dict[str, Any]]], new: tuple[list[str], list[dict[str, Any]]]) -> dict[str, Any]:
    """The kept run (``run``, ``rows``) with a run of some rows put in: same keys replaced in place,
    new keys appended, and one header line saying which rows came from that run, when and where."""
    (run, rows), (new_run, new_rows) = kept, new
    fresh = {r["key"]: r for r in new_rows}
    out = [fresh.pop(r["key"], r) for r in rows] + [r for r in new_rows if r["key"] in fresh]
    when = new_run[0].removeprefix("airflow-resumable benchmarks, ") if new_run else "?"
    machine = new_run[1].removeprefix("machine: ") if len(new_run) > 1 else "?"
    keys = [r["key"] for r in new_rows]
    note = f"rows {keys[0]}-{keys[-1]} measured on their own, {when} (python -m bench --only): {machine}"
    lines = [line for line in run if not line.startswith(f"rows {keys[0]}-{keys[-1]} measured on their own")]
    return {"run": lines[:-1] + [note] + lines[-1:] if lines else [note], "rows": out}


def main() -> int:
    import json

    args = sys.argv[1:]
    if args[:1] == ["--merge"] and len(args) == 2:
        data = merged(load(BENCH / "results.json"), load(Path(args[1])))
        (BENCH / "results.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    elif args:
        shutil.copyfile(args[0], BENCH / "results.json")
    run, results = load(BENCH / "results.json")
    for name, svg in plots(results).items():
        (BENCH / name).write_text(svg)
        print(f"docs/bench/{name}")
    PAGE.write_text(page_with_table(PAGE.read_text(), markdown(run, results)))
    print("docs/benchmarks.md (its table)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
