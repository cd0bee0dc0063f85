"""A stop request that only a checkpoint can carry (tests/unit/core/attempt/test_stop_at_checkpoint.py
and its edges' module): the slot, an attempt whose lease is so long its keeper never heartbeats during
a test, fast items that checkpoint each one and call back after it, the slot's row, and a bounded wait.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from airflow_resumable.core import Attempt, Options, Store
from airflow_resumable.core.model.identity import Identity

JOB, SLOT = "stop_at_checkpoint", "2026-02-01T00:00:00+00:00"
DAY = datetime(2026, 3, 2, tzinfo=timezone.utc)
#: The request is asked right after this checkpoint; the run must stop at the next one.
ASK_AT = 10
#: A lease no test outlives: the keeper's first heartbeat would come after 200 s.
LEASE = 600.0


def attempt(store: Store, **options: Any) -> Attempt:
    return Attempt(
        store, Identity(job=JOB, slot=SLOT, attempt=1, owner="owner-1"), options=Options(lease=LEASE, **options),
    )


def row(store: Store) -> Any:
    with store.open() as s:
        return s.checkpoints.load(JOB, SLOT)


class FastItems:
    """Items 0..n-1, one a chunk, each checkpointed; ``after(ctx, i)`` runs after checkpoint ``i``."""

    def __init__(self, n: int, after: Any, *, transactional: bool = False):
        self.n, self.after, self.transactional = n, after, transactional
        self.seen: list[int] = []

    def __call__(self, ctx: Any) -> None:
        i = ctx.position or 0
        while i < self.n:
            if self.transactional:  # the chunk's write commits with its checkpoint
                ctx.transaction().execute("INSERT INTO sink (item) VALUES (%s)", (i,))
            self.seen.append(i)
            i += 1
            ctx.checkpoint(i, processed=i)
            self.after(ctx, i)
