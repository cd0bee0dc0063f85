"""``ctx.map()``: a chunk's items at once, and a checkpoint at their contiguous low-water mark.

Given / When / Then, against both stores: never past an unfinished item, the skip policy, a property
test over random completion orders and crash points, and running totals counted once after a crash.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_resumable.core import SQLiteStore, Store
from support.attempts import JOB, SLOT, attempt


def test_map_checkpoints_the_contiguous_low_water_mark_never_past_an_unfinished_item(store: Store) -> None:
    # Given items whose work finishes in reverse order within each window, and a handler that
    # records, at every checkpoint, which items had finished
    finished: set[int] = set()
    marks: list[tuple[int, set[int]]] = []

    async def handler(ctx: Any) -> list[Any]:
        original = ctx._asave_mark  # ctx.map's save

        async def spy(position: Any, **kw: Any) -> None:
            marks.append((position, set(finished)))
            await original(position, **kw)

        ctx._asave_mark = spy

        async def work(item: int) -> int:
            await asyncio.sleep(0.002 * (10 - item % 10))
            finished.add(item)
            return item * 2

        return await ctx.map(range(100), work, limit=10, every=3)

    # When it runs
    outcome = attempt(store, 1).run(handler)
    # Then every saved position had every item up to it finished, and the results are in item order
    assert marks and all(set(range(position + 1)) <= done for position, done in marks)
    assert outcome.result == [i * 2 for i in range(100)]
    assert (outcome.checkpoint.position, outcome.checkpoint.processed) == (99, 100)


def test_map_with_the_skip_policy_sends_a_failed_item_to_the_dead_letters_and_moves_on(store: Store) -> None:
    # Given items of which 7 fails with a skippable error
    async def handler(ctx: Any) -> list[Any]:
        async def work(item: int) -> int:
            await asyncio.sleep(0)
            if item == 7:
                raise ValueError("bad item 7")
            return item

        return await ctx.map(range(20), work, limit=4, skip_on=ValueError)

    # When it runs
    outcome = attempt(store, 1).run(handler)
    # Then the mark passed item 7, which is in the dead letters, and the run is done
    assert (outcome.checkpoint.status, outcome.checkpoint.position, outcome.checkpoint.processed) == ("done", 19, 20)
    assert outcome.result[7] is None and outcome.result[8] == 8
    with store.open() as s:
        letters = s.skips.items(JOB, SLOT)
    assert [(d.position, d.error, d.status) for d in letters] == [(7, "ValueError: bad item 7", "skipped")]


@settings(max_examples=30, deadline=None)
@given(
    durations=st.lists(st.integers(min_value=0, max_value=4), min_size=30, max_size=30),
    crash_at=st.integers(min_value=0, max_value=29),
    limit=st.integers(min_value=1, max_value=8),
    every=st.integers(min_value=1, max_value=5),
)
def test_map_never_skips_an_item_and_a_crash_repeats_at_most_the_window(
        durations: list[int], crash_at: int, limit: int, every: int) -> None:
    # Given items of random durations and an item that fails (a crash) on attempt 1
    with tempfile.TemporaryDirectory() as home:
        store = SQLiteStore(os.path.join(home, "checkpoints.db"))
        completed: list[list[int]] = [[], []]

        async def handler(ctx: Any) -> None:
            async def work(item: int) -> None:
                await asyncio.sleep(durations[item] / 1000)
                if ctx.attempt == 1 and item == crash_at:
                    raise RuntimeError("crash")
                completed[ctx.attempt - 1].append(item)

            start = 0 if ctx.position is None else ctx.position + 1
            await ctx.map(range(start, 30), work, limit=limit, every=every)

        # When attempt 1 crashes and attempt 2 resumes
        with pytest.raises(RuntimeError, match="crash"):
            attempt(store, 1).run(handler)
        attempt(store, 2).run(handler)
        # Then no item was skipped, and at most the window (limit + every) was done twice
        assert set(completed[0]) | set(completed[1]) == set(range(30))
        repeated = set(completed[0]) & set(completed[1])
        assert len(repeated) <= limit + every, (sorted(repeated), limit, every)


def test_a_running_total_in_ctx_state_under_map_counts_every_item_once_after_a_crash(store: Store) -> None:
    # Given items that finish out of order, each adding to ctx.state["total"], and a crash on
    # attempt 1 at item 4 (after the mark 3 was saved with items 5 to 7 finished and added)
    seen: list[list[int]] = [[], []]

    async def handler(ctx: Any) -> int:
        ctx.state.setdefault("total", 0)

        async def add(item: int) -> None:
            # every 4th item is slow: the mark waits for it while the 3 after it finish; item 4 the slowest
            await asyncio.sleep(0.001 if item % 4 else 0.08 if item == 4 else 0.02)
            if ctx.attempt == 1 and item == 4:
                raise RuntimeError("crash")
            seen[ctx.attempt - 1].append(item)
            ctx.state["total"] += item

        start = 0 if ctx.position is None else ctx.position + 1
        await ctx.map(range(start, 30), add, limit=8, every=2)
        return int(ctx.state["total"])

    with pytest.raises(RuntimeError, match="crash"):
        attempt(store, 1).run(handler)
    # When attempt 2 resumes
    outcome = attempt(store, 2).run(handler)
    # Then the total counts every item once: the items attempt 1 finished past the saved position
    # (their effect saved with it) were not run again, and none was skipped
    assert outcome.result == sum(range(30)) == outcome.checkpoint.state["total"]
    assert set(seen[0]) | set(seen[1]) == set(range(30))
    assert "resumable_map_done" not in outcome.checkpoint.state
