"""``python -m bench [--only 1,2,...]``: run the benchmarks and print one table of ratios.

The table goes to stdout (and to ``.bench/results.md``); progress lines go to stderr. The exit
status is 1 when a row could not be measured (an error), or with ``--strict`` when a target was
missed; 0 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import sqlite3
import sys
import time
import traceback

from bench import airflow_env
from bench.common import PRECISION, ROOT, RUN, Database, Result, imprecise, say, table

#: Each row of the table: the module and function that measure it, ``run(db) -> list[Result]``.
_RUNNERS = {
    "1": ("bench.commit", "run"),
    "2": ("bench.loans", "run"),
    "3": ("bench.native", "run"),
    "4": ("bench.cancel", "run"),
    "5": ("bench.heartbeat", "run"),
    "6": ("bench.scale", "run"),
    "7": ("bench.overhead", "run"),
    "8": ("bench.hot", "run_wal"),
    "9": ("bench.hot", "run_size"),
    "10": ("bench.concurrency", "run"),
    "11": ("bench.leases", "run"),
    "12": ("bench.throttle", "run"),
    "13": ("bench.txheartbeat", "run"),
    "14": ("bench.partitions", "run"),
    "15": ("bench.partitioned_workers", "run"),
    "16": ("bench.items", "run"),
    "17": ("bench.statements", "run"),
    "18": ("bench.stop_requests", "run"),
    "19": ("bench.async_items", "run"),
    "20": ("bench.rebalancing", "run"),
}
ROWS = tuple(_RUNNERS)


def _runner(row: str):  # noqa: ANN202 - a module's run(db) -> list[Result]
    import importlib

    module, function = _RUNNERS[row]
    return getattr(importlib.import_module(module), function)


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores ({cpu}), load average {load}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--only", default=",".join(ROWS), help="comma-separated rows to run (default: all)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    rows = [r.strip() for r in args.only.split(",") if r.strip()]
    unknown = set(rows) - set(ROWS)
    if unknown:
        parser.error(f"unknown row(s) {sorted(unknown)}; rows are {', '.join(ROWS)}")

    # Airflow reads its configuration on first import: set up its temporary home before any row
    # imports it (rows 3 and 7 run real tasks; nothing imported so far imports Airflow).
    airflow_env.configure()
    # The runs cancelled on purpose log warnings; keep the output to the table.
    logging.getLogger("airflow_resumable").setLevel(logging.ERROR)
    started = time.monotonic()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results: list[Result] = []
    errors = 0
    db: Database | None = None
    try:
        db = Database()
        header = [
            f"airflow-resumable benchmarks, {when}",
            f"machine: {_machine()}",
            f"checkpoints: {db.describe()}, database {db.name}; SQLite {sqlite3.sqlite_version}",
        ]
        for line in header:
            say(line)
        for row in rows:
            try:
                measured = _runner(row)(db)
                results += measured
                RUN.update((r.key, r) for r in measured)
            except Exception as exc:  # one broken row must not hide the others
                errors += 1
                traceback.print_exc()
                error = f"{type(exc).__name__}: {exc}"[:160]
                results.append(Result(row, "could not be measured", error, None, "-", False))
    finally:
        if db is not None:
            db.drop()
        airflow_env.cleanup()

    elapsed = time.monotonic() - started
    from importlib.metadata import version

    header.append(
        f"Airflow {version('apache-airflow')}, task SDK {version('apache-airflow-task-sdk')}; total {elapsed:.0f} s"
    )
    text = "\n".join(header) + "\n\n" + table(results)
    notes = [f"- [{r.key}] {n}" for r in results for n in r.notes]
    if loose := imprecise(results):
        notes.append(f"- Judged rows whose median this run could not pin down to +/-{PRECISION:.0%} (half the median's "
                     f"95% interval; a second run can land anywhere in it): {', '.join(loose)}")
    if notes:
        text += "\n\nNotes:\n" + "\n".join(notes)
    print(text, flush=True)

    out = ROOT / ".bench"
    out.mkdir(exist_ok=True)
    (out / "results.md").write_text(text + "\n")
    (out / "results.json").write_text(
        json.dumps(
            {"run": header, "rows": [{**r.__dict__, "verdict": r.verdict} for r in results]}, indent=2, default=str
        )
        + "\n"
    )
    missed = sum(1 for r in results if r.passed is False)
    if errors:
        return 1
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
