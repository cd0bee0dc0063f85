"""``make chaos TRIALS=100`` (or ``SEED=...`` to replay one trial): trials on one deployment, the
report (:mod:`.report`) printed and written to ``--out`` (``<executor>.md`` and ``<executor>.json``).
Exits non-zero on any anomaly or unsettled trial, or when fewer than 90 % of the faults hit.

    PYTHONPATH=.:tests python -m support.chaos --trials 100 [--seed N] [--executor celery|local] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time
from pathlib import Path

from devtools.postgres import Server
from support.chaos.cluster import chaos_cluster
from support.chaos.hosts import netem_available, sweep
from support.chaos.report import REPLAY, misses, passed, results, write
from support.chaos.report import markdown as report
from support.chaos.trials import run_trial
from support.chaos.verdicts import KINDS


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # the cleanup in the finally blocks runs


def main() -> int:
    # A background job ignores SIGINT: stop on SIGTERM too, cleaning up.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, help="replay the trial with this seed (one trial)")
    parser.add_argument("--first", type=int, help="the first seed of the trials (default: a random one)")
    parser.add_argument("--executor", choices=("celery", "local"), default="celery",
                        help="Celery workers on the hosts, or schedulers with their LocalExecutor")
    parser.add_argument("--redis-db", type=int, default=9,
                        help="the broker's Redis database (flushed): one per run at the same time")
    parser.add_argument("--minutes", type=float, default=None, help="stop starting trials after this long")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="the fault kinds to draw from, comma-separated (default: all); a replay needs the same")
    parser.add_argument("--out", type=Path, default=Path(".chaos"),
                        help="where the report goes: <executor>.md and <executor>.json (default .chaos/)")
    args = parser.parse_args()
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown fault kinds {sorted(unknown)}: one of {', '.join(KINDS)}")
    replay = REPLAY + ("" if kinds == KINDS else f" FAULTS={','.join(kinds)}")
    base = args.seed if args.seed is not None else args.first if args.first is not None else random.randrange(10**6)
    count = 1 if args.seed is not None else args.trials
    print(f"chaos: {count} trial(s) on {args.executor}, seeds {base}..{base + count - 1}", flush=True)
    left = sweep()
    if left:
        print(f"removed leftovers of a crashed run: {left}")
    skipped = {}
    if (why := netem_available()) is not None:
        skipped["netem"] = why
        print(f"note: the netem fault is skipped ({why}); the lossy fault (a proxy) brings latency and loss",
              flush=True)
    server = Server().start()
    trials = []
    began = time.monotonic()
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    try:
        # not the tests' broker database (nor another run's: each flushes its own)
        with chaos_cluster(server.admin_dsn, redis_db=args.redis_db, executor=args.executor) as chaos:
            for seed in range(base, base + count):
                if deadline is not None and time.monotonic() > deadline:
                    print(f"stopping after {len(trials)} trials: --minutes {args.minutes:g} ran out")
                    break
                trial = run_trial(chaos, seed, netem="netem" not in skipped, kinds=kinds)
                trials.append(trial)
                print(trial.summary(), flush=True)
    finally:
        server.stop()
    res = results(trials, executor=args.executor, skipped=skipped, minutes=(time.monotonic() - began) / 60,
                  replay=replay)
    data, page = write(res, args.out)
    print()
    print(report(res))
    if misses(res):
        print("\nfaults that did not hit:\n" + misses(res))
    print(f"\nthe report: {page}; the results: {data}")
    return 0 if passed(res)[0] else 1


if __name__ == "__main__":
    sys.exit(main())
