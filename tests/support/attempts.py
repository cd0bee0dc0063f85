"""An attempt of one job's slot and a handler over numbered items that records what it processed:
the core's attempt tests (tests/unit/core/attempt/, tests/unit/core/work/) share them.
"""

from __future__ import annotations

from typing import Any

from airflow_resumable.core import Attempt, Options, Store
from airflow_resumable.core.model.checkpoint import MAX_DEPTH
from airflow_resumable.core.model.identity import Identity

JOB, SLOT = "loans", "2026-01-01T00:00:00+00:00"


#: Deeper than the product's nesting limit, and shallow enough for every supported Python's own
#: JSON and repr: the refusal is the product's, the same on 3.11 and 3.13.
TOO_DEEP = MAX_DEPTH + 100


def attempt(store: Store, n: int, **options: Any) -> Attempt:
    return Attempt(store, Identity(job=JOB, slot=SLOT, attempt=n, owner=f"owner-{n}"), options=Options(**options))


class Items:
    """A handler over items 0..n-1 that records every item it processes (the side effect)."""

    def __init__(self, n: int, chunk: int, *, fail: tuple[int, int] | None = None):
        self.n, self.chunk, self.fail = n, chunk, fail
        self.seen: list[int] = []

    def __call__(self, ctx) -> int:
        i = ctx.position or 0
        ctx.total = self.n
        while i < self.n:
            ctx.signal.raise_if_cancelled()
            batch = list(range(i, min(i + self.chunk, self.n)))
            self.seen.extend(batch)
            if self.fail and (ctx.attempt, i // self.chunk) == self.fail:
                raise RuntimeError(f"injected failure in chunk {i // self.chunk}")
            ctx.state["sum"] = ctx.state.get("sum", 0) + sum(batch)
            i = batch[-1] + 1
            ctx.checkpoint(i, processed=i)
        return ctx.state["sum"]
