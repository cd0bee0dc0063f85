"""``make chaos TRIALS=100`` (or ``SEED=...`` to replay one trial): trials on one deployment, a table.

    PYTHONPATH=.:tests python -m support.chaos --trials 100 [--seed N] [--executor celery|local]
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time

from devtools.postgres import Server
from support.chaos.cluster import chaos_cluster
from support.chaos.hosts import netem_available, sweep
from support.chaos.trials import run_trial, table

REPLAY = "make chaos SEED={seed} EXECUTOR={executor}"


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
    args = parser.parse_args()
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
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    try:
        # not the tests' broker database (nor another run's: each flushes its own)
        with chaos_cluster(server.admin_dsn, redis_db=args.redis_db, executor=args.executor) as chaos:
            for seed in range(base, base + count):
                if deadline is not None and time.monotonic() > deadline:
                    print(f"stopping after {len(trials)} trials: --minutes {args.minutes:g} ran out")
                    break
                trial = run_trial(chaos, seed, netem="netem" not in skipped)
                trials.append(trial)
                print(trial.summary(), flush=True)
    finally:
        server.stop()
    print()
    print(table(trials, skipped=skipped, replay=REPLAY.replace("{executor}", args.executor)))
    return 1 if any(t.anomalies or t.unsettled for t in trials) or not trials else 0


if __name__ == "__main__":
    sys.exit(main())
