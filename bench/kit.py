"""``python -m bench.kit [--before main] [--counts 10,100,1000]``: the test kit's cost, before and after.

Times the kit's default check (``check_resumable(handler).assert_ok()``, every default argument) of
a correct handler that makes N checkpoints (a running total in ``ctx.state``), for each N, with
two kits in one process, one after the other for each N: the kit of this checkout ("after") and
the kit of a git ref ("before", default ``main``; its ``airflow_resumable/testing/kit.py`` is
loaded from git, over this checkout's core). Not a row of ``make bench``: the kit before its
sampling is quadratic in N, and takes minutes.

When the before side's full check would run more than ``--budget`` trials (7 kinds x N points),
it is estimated: the reference run, then each kind at ``--probes`` points spread over the run,
their mean time per trial times the trials the full check runs (``--full`` runs all of them).
The after side always runs in full. Each side runs once (the "medians" of the table are single
runs). The after side's 100-checkpoint figure is judged against the target, 20 s; the others are
printed for context. Wall time on a shared machine: compare the two sides of a row, not rows of
different runs.
"""

from __future__ import annotations

import argparse
import functools
import logging
import subprocess
import sys
import time
import types
from collections.abc import Callable
from typing import Any

from bench.common import ROOT, Result, table

#: The issue's target: a correct 100-checkpoint handler's default check, in seconds.
TARGET_SECONDS = 20.0


def running_total(ctx: Any, checkpoints: int) -> int:
    """A correct handler: one item a chunk, the running total in ``ctx.state``."""
    i = ctx.position or 0
    while i < checkpoints:
        i += 1
        ctx.state["total"] = ctx.state.get("total", 0) + i
        ctx.checkpoint(i, processed=i)
    return int(ctx.state.get("total", 0))


def kit_of(ref: str) -> types.ModuleType:
    """The test kit's module as the git ref ``ref`` has it, over this checkout's core."""
    source = subprocess.run(["git", "show", f"{ref}:airflow_resumable/testing/kit.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType(f"_kit_{ref.replace('/', '_')}")
    module.__file__ = f"{ref}:airflow_resumable/testing/kit.py"
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def _handler(n: int) -> Callable[[Any], int]:
    """The handler of ``n`` checkpoints, named ``bench.kit.running_total`` (not ``__main__``'s:
    the kit's new processes import it by name)."""
    from bench import kit as this

    return functools.partial(this.running_total, checkpoints=n)


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    value = call()
    return time.perf_counter() - began, value


def before(kit: types.ModuleType, n: int, *, budget: int, probes: int, full: bool) -> tuple[float, str]:
    """The before kit's default check of an ``n``-checkpoint handler: seconds, and how they were had."""
    handler = _handler(n)
    kinds = list(kit.ALL_INTERRUPTIONS)
    trials = len(kinds) * n
    if full or trials <= budget:
        seconds, report = _timed(lambda: kit.check_resumable(handler).assert_ok())
        assert len(report.trials) == trials, (len(report.trials), trials)
        return seconds, f"all {trials} trials"
    reference, _ = _timed(lambda: kit.check_resumable(handler, interruptions=[]))
    points = sorted({max(1, round(n * (i + 1) / probes)) for i in range(probes)})
    probe, report = _timed(lambda: kit.check_resumable(handler, points=points).assert_ok())
    per_trial = (probe - reference) / len(report.trials)
    return reference + per_trial * trials, f"estimated from {len(report.trials)} of its {trials} trials"


def after(n: int) -> tuple[float, str]:
    """This checkout's kit's default check of an ``n``-checkpoint handler."""
    from airflow_resumable.testing import check_resumable

    seconds, report = _timed(lambda: check_resumable(_handler(n)).assert_ok())
    kinds = len(report.trials) // max(len(report.points), 1)
    sample = f", seed {report.seed}" if report.seed is not None else ""
    return seconds, f"{len(report.trials)} trials: {len(report.points)} points x {kinds} kinds{sample}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="main", help="the git ref of the kit before (default: main)")
    parser.add_argument("--counts", default="10,100,1000", help="checkpoints of the handler, comma-separated")
    parser.add_argument("--budget", type=int, default=700, help="the most trials the before side runs in full")
    parser.add_argument("--probes", type=int, default=3, help="points a kind is timed at, when the before side is estimated")
    parser.add_argument("--full", action="store_true", help="run the before side in full, however long")
    args = parser.parse_args(argv)
    logging.getLogger("airflow_resumable").setLevel(logging.ERROR)  # the interrupted attempts' warnings
    old = kit_of(args.before)
    results = []
    for n in (int(c) for c in args.counts.split(",") if c.strip()):
        print(f"{n} checkpoints: before ...", file=sys.stderr, flush=True)
        was, how_before = before(old, n, budget=args.budget, probes=args.probes, full=args.full)
        print(f"{n} checkpoints: after ...", file=sys.stderr, flush=True)
        now, how_after = after(n)
        judged = n == 100
        results.append(Result(
            key=f"kit-{n}", what=f"default check, {n} checkpoints: {args.before} / this checkout",
            measured=f"{was:.1f} s ({how_before}) / {now:.1f} s ({how_after})", ratio=was / now,
            target=f"after <= {TARGET_SECONDS:g} s" if judged else "-",
            passed=(now <= TARGET_SECONDS) if judged else None))
    print(table(results))
    return 0 if all(r.passed is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
