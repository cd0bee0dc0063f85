"""An attempt in its own process whose chunks hold SQLite's write lock, for the concurrency tests.

    python sqlite_load_worker.py STORE_SPEC JOB SLOT ITEMS CHUNK HOLD_SECONDS ATTEMPT [LEASE]

Each chunk inserts its items into ``sink (slot, item)`` through ctx.transaction() (which takes
the write lock), then keeps working for HOLD_SECONDS inside that transaction, then checkpoints:
the database's write lock is free only between a checkpoint's commit and the next chunk's first
write. Default options (lease, busy timeout) unless LEASE is given. Prints JSON lines:
``{"event": "checkpoint", "position": ...}`` every 20 checkpoints, and at the end
``{"event": "stopped", "status": ..., "error": ..., "reason": ..., "beats": ...}`` (exit 0 when done).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_resumable.core.attempt.runner import Attempt, Options  # noqa: E402
from airflow_resumable.core.model.identity import Identity
from support.stores import store_of  # noqa: E402


def say(**event) -> None:
    print(json.dumps({**event, "t": time.time(), "pid": os.getpid()}), flush=True)


def main() -> None:
    spec, job, slot, items, chunk, hold, attempt = sys.argv[1:8]
    n, size, hold_s = int(items), int(chunk), float(hold)
    options = Options(lease=float(sys.argv[8])) if len(sys.argv) > 8 else Options()

    def handler(ctx):
        i = ctx.position or 0
        tx = ctx.transaction()
        while i < n:
            batch = range(i, min(i + size, n))
            tx.executemany("INSERT INTO sink (slot, item) VALUES (%s, %s)", [(slot, item) for item in batch])
            time.sleep(hold_s)  # the chunk's work, inside its transaction: the write lock stays taken
            i = batch[-1] + 1
            ctx.checkpoint(i, processed=i, total=n)
            if (i // size) % 20 == 0:
                say(event="checkpoint", position=i)
        return i

    run = Attempt(
        store_of(spec), Identity(job=job, slot=slot, attempt=int(attempt), owner=f"{slot}-{attempt}-{os.getpid()}"),
        options=options,
    )
    beats = lambda: run.keeper.beats if run.keeper else 0  # noqa: E731
    try:
        outcome = run.run(handler)
    except BaseException as exc:  # report how it stopped
        say(event="stopped", status=None, error=f"{type(exc).__name__}: {exc}", reason=getattr(exc, "reason", None),
            beats=beats())
        sys.exit(3)
    say(event="stopped", status=outcome.checkpoint.status, error=None, reason=None, beats=beats())


if __name__ == "__main__":
    main()
