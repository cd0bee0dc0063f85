"""An attempt in its own process that reports each checkpoint on stdout, for lease tests.

    python lease_worker.py STORE_SPEC JOB SLOT ITEMS CHUNK CHUNK_SECONDS ATTEMPT LEASE

Each chunk waits CHUNK_SECONDS on the signal, writes its items to ``sink`` through
ctx.transaction(), and checkpoints; then a JSON line ``{"event": "checkpoint", ...}`` is printed.
At the end: ``{"event": "stopped", "error": ..., "reason": ...}``. With ``LEASE_WORKER_GATE`` set
to a path, the attempt holds (heartbeating) after each checkpoint until that file exists.
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
    spec, job, slot, items, chunk, chunk_s, attempt, lease = sys.argv[1:9]
    n, size, pause = int(items), int(chunk), float(chunk_s)
    owner = f"attempt{attempt}-pid{os.getpid()}"
    gate = os.environ.get("LEASE_WORKER_GATE")

    def handler(ctx):
        i = ctx.position or 0
        while i < n:
            ctx.signal.raise_if_cancelled()
            ctx.signal.wait(pause)
            batch = list(range(i, min(i + size, n)))
            cur = ctx.transaction().cursor()
            for item in batch:
                cur.execute("INSERT INTO sink (item, owner) VALUES (%s, %s)", (item, owner))
            i = batch[-1] + 1
            ctx.checkpoint(i, processed=i, total=n)
            say(event="checkpoint", position=i)
            if gate and i < n:
                # Hold the run open until the test says so, heartbeating all along.
                while not os.path.exists(gate):
                    ctx.signal.raise_if_cancelled()
                    ctx.signal.wait(0.02)
        return i

    run = Attempt(
        store_of(spec), Identity(job=job, slot=slot, attempt=int(attempt), owner=owner),
        options=Options(lease=float(lease)),
    )
    try:
        run.run(handler)
    except BaseException as exc:  # report how it stopped
        say(event="stopped", error=type(exc).__name__, reason=getattr(exc, "reason", None), beats=run.keeper.beats if run.keeper else 0)
        sys.exit(3)
    say(event="stopped", error=None, reason=None, beats=run.keeper.beats if run.keeper else 0)


if __name__ == "__main__":
    main()
