"""An attempt in its own process, for crash tests: writes items through ctx.transaction().

    python kill_worker.py STORE_SPEC JOB SLOT ITEMS CHUNK ATTEMPT LEASE

Each chunk inserts its items into ``sink`` (no unique key, so a duplicate would show) through the
checkpoint's connection, spins a little, and checkpoints. Exit 0 when done.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_resumable.core.attempt.runner import Attempt, Options  # noqa: E402
from airflow_resumable.core.model.identity import Identity
from support.stores import store_of  # noqa: E402


def main() -> None:
    spec, job, slot, items, chunk, attempt, lease = sys.argv[1:8]
    n, size = int(items), int(chunk)
    store = store_of(spec)

    def handler(ctx):
        i = ctx.position or 0
        while i < n:
            batch = list(range(i, min(i + size, n)))
            cur = ctx.transaction().cursor()
            for item in batch:
                cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (item, ctx.attempt))
                sum(range(2000))  # a little work between the writes: the kill lands anywhere
            i = batch[-1] + 1
            ctx.checkpoint(i, processed=i, total=n)
        return i

    Attempt(
        store, Identity(job=job, slot=slot, attempt=int(attempt), owner=f"pid{os.getpid()}"),
        options=Options(lease=float(lease)),
    ).run(handler)


if __name__ == "__main__":
    main()
