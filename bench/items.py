"""Row 2j: the chunk loop's own cost in instructions, the noise-free companion of row 2i.

Counts the instructions this process executes (valgrind's cachegrind, no cache simulation) for
three loops over rows held in memory, chunks of 3,000, the position each row's first column:

* **bare** -- a hand-written loop over the same pages, summing ``days``;
* **bare+check** -- the same with the order check written by hand as cheaply as CPython allows
  (:func:`bench.loans.order_check`): the floor of a loop that keeps ours' guarantee;
* **unsaved** -- ours (:func:`~airflow_resumable.core.work.chunk_loop.chunk_loop` in an attempt on a
  SQLite file) with its checkpoint writes left out: the loop, the order check, encoding, tally;
* **saved** -- ours with its checkpoints, each a SQLite commit: their client side (statement,
  SQLite's own code; the file system's work is the kernel's, not counted).

Each loop runs over two row counts; the difference between them divided by the difference of the
counts is the cost per item, free of the interpreter's start and the attempt's fixed cost. A
count is the same from run to run within a fraction of a percent, whoever else uses the machine.
The database server's time is not in it (there is none: rows in memory, checkpoints in SQLite).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from airflow_resumable.core.model.identity import Identity

CHUNK = 3_000
COUNTS = (60_000, 240_000)
SIDES = ("bare", "bare+check", "unsaved", "saved")


def _rows(n: int) -> list[tuple[int, int]]:
    return [(i, i % 30) for i in range(1, n + 1)]


def _bare(rows: list[tuple[int, int]], check: bool = False) -> int:
    from bench.loans import order_check  # imported by _child on every side alike

    after, total, i = 0, 0, 0
    while True:
        batch = rows[i:i + CHUNK]
        if not batch:
            return total
        if check:
            order_check(after, batch)
        total += sum(days for _, days in batch)
        after, i = batch[-1][0], i + len(batch)
    return after


def _ours(rows: list[tuple[int, int]], path: str, saves: bool) -> int:
    from airflow_resumable.core.attempt.context import Running
    from airflow_resumable.core.attempt.runner import Attempt
    from airflow_resumable.core.model.checkpoint import Write
    from airflow_resumable.core.stores import SQLiteStore
    from airflow_resumable.core.work.chunk_loop import chunk_loop

    class UnsavedRunning(Running):
        def _save(self, write: Write) -> None:
            return None

    class Unsaved(Attempt):
        running_type = UnsavedRunning

    def read(ctx: Any, after: Any, limit: int) -> list[tuple[int, int]]:
        start = 0 if after is None else after  # row i sits at index i - 1
        return rows[start:start + limit]

    def process(ctx: Any, batch: list[tuple[int, int]]) -> None:
        ctx.state["total"] = ctx.state.get("total", 0) + sum(days for _, days in batch)

    attempt = (Attempt if saves else Unsaved)(
        SQLiteStore(path), Identity(job="items", slot=f"n{len(rows)}", attempt=1, owner="bench"),
    )
    attempt.run(chunk_loop(read, process, chunk_size=CHUNK, total=len(rows)))
    return 0


def _child(side: str, n: int, path: str) -> None:
    import airflow_resumable.core.attempt.runner  # noqa: F401 - imported in every side's process alike
    import bench.loans  # noqa: F401 - the hand-written check's module, likewise
    from airflow_resumable.core.stores import SQLiteStore

    with SQLiteStore(path).open() as s:  # the schema exists before the counted loop runs
        s.ensure_schema()
    rows = _rows(n)
    if side in ("bare", "bare+check"):
        _bare(rows, check=side == "bare+check")
    else:
        _ours(rows, path, saves=side == "saved")


def instructions(side: str, n: int) -> int:
    """The instructions of one process running ``side`` over ``n`` rows (its start included)."""
    with tempfile.TemporaryDirectory(prefix="resumable-items-") as tmp:
        out = Path(tmp) / "cg.out"
        result = subprocess.run(
            ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}", sys.executable,
             "-m", "bench.items", side, str(n), str(Path(tmp) / "checkpoints.db")],
            capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"}, check=False,
        )
        found = re.search(r"I\s+refs:\s+([\d,]+)", result.stderr)
        if result.returncode != 0 or not found:
            raise RuntimeError(f"cachegrind failed ({result.returncode}): {result.stderr[-800:]}")
        return int(found[1].replace(",", ""))


def available() -> bool:
    return shutil.which("valgrind") is not None


def measure() -> dict[str, dict[int, int]]:
    """Instructions per side and row count."""
    return {side: {n: instructions(side, n) for n in COUNTS} for side in SIDES}


def per_item(counts: dict[str, dict[int, int]], side: str) -> float:
    low, high = COUNTS
    return (counts[side][high] - counts[side][low]) / (high - low)


def run(db: Any) -> list[Any]:
    from bench.common import Result, say

    if not available():
        return [Result("2j", "the loop's instructions per item (cachegrind)", "valgrind is not installed", None, "-",
                       None)]
    say(f"row 2j: instructions of four loops over {COUNTS[0]:,} and {COUNTS[1]:,} rows in memory (cachegrind, "
        "8 processes)")
    counts = measure()
    bare, checked, unsaved, saved = (per_item(counts, side) for side in SIDES)
    low = COUNTS[0]
    fixed = (counts["unsaved"][low] - counts["bare"][low]) - (unsaved - bare) * low
    per_checkpoint = (saved - unsaved) * CHUNK
    return [
        Result(
            "2j", "the loop's own instructions per item, checkpoint writes left out, vs the bare loop (cachegrind)",
            f"{unsaved - bare:.0f} instructions/item more ({unsaved:.0f} vs {bare:.0f})", None,
            "(reported, per item)", None, spread="exact (counted)",
            notes=[
                f"2j: instructions counted by cachegrind for this process only (no database server: rows in memory, "
                f"checkpoints in a SQLite file), the difference between {COUNTS[0]:,} and {COUNTS[1]:,} rows: per item "
                f"bare {bare:.0f}, ours without checkpoint writes {unsaved:.0f}, with them {saved:.0f}; an attempt's "
                f"fixed part {fixed / 1e6:.1f} M instructions (SQLite: schema check, lease, start, finish); a SQLite "
                f"checkpoint's client side {per_checkpoint / 1e3:.0f} k instructions",
            ],
        ),
        Result(
            "2j+", "the order check by hand, instructions per item, and ours over the bare loop with it (cachegrind)",
            f"check {checked - bare:.0f} instructions/item; ours {unsaved - checked:.0f} more ({unsaved:.0f} vs "
            f"{checked:.0f})", None, "(reported, per item)", None, spread="exact (counted)",
            notes=[
                "2j+: the bare loop with bench.loans.order_check on every batch (the cheapest sound check measured "
                "here) is the floor of a loop that refuses out-of-order batches; what ours costs an item over it is "
                "the rest of the loop (the tally, the checkpoint's encoding per chunk spread over its items)",
            ],
        ),
    ]


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]), sys.argv[3])
