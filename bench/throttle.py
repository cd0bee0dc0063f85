"""Row 12: what ``throttle=`` costs per chunk when it returns None (no wait), on SQLite.

Two attempts of the same loop of ``CHUNKS`` checkpoints, interleaved: one without a throttle, one
whose throttle returns None after every checkpoint. The difference per checkpoint is the cost:
one Python call and the check of its answer.
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

from airflow_resumable.core import Attempt, Options
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import SQLiteStore
from bench.common import Result, interleave, median, say

CHUNKS = 500
ROUNDS = 15


def run(db: object) -> list[Result]:
    say("row 12: the throttle's cost per chunk when it returns None (SQLite)")
    slots = itertools.count()

    def loop(ctx) -> None:  # noqa: ANN001 - the run context
        for i in range(CHUNKS):
            ctx.checkpoint(i + 1, processed=i + 1)

    with tempfile.TemporaryDirectory(prefix="resumable-bench-") as tmp:
        store = SQLiteStore(Path(tmp) / "checkpoints.db")

        def side(options: Options):  # noqa: ANN202 - a timed call
            def once() -> None:
                Attempt(
                    store, Identity(job="bench", slot=f"s{next(slots)}", attempt=1, owner="bench"), options=options,
                ).run(loop)
            return once

        times = interleave(
            {"plain": side(Options(lease=60)), "throttle": side(Options(lease=60, throttle=lambda ctx: None))},
            rounds=ROUNDS, warmup=1,
        )
    plain, throttled = median(times["plain"]) / CHUNKS, median(times["throttle"]) / CHUNKS
    extra = throttled - plain
    return [Result(
        "12", "a throttle returning None: ctx.checkpoint() with it vs without (SQLite)",
        f"{plain * 1e6:.0f} vs {throttled * 1e6:.0f} µs per chunk ({extra * 1e6:+.1f} µs)", throttled / plain,
        "(reported)", None,
    )]
