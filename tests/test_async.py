"""``async def`` handlers: the same attempt, driven on an event loop of its own.

Given / When / Then, against both stores: resume after a failure and after a real process death,
every stop source cancelling a pending await within a bounded time, a checkpoint that never blocks
the loop for long, and ``ctx.map``'s contiguous low-water mark (a property test).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_resumable.core import (
    Attempt,
    Cancelled,
    LeaseLost,
    Options,
    Paused,
    Reason,
    SQLiteStore,
    Store,
    chunk_loop,
    control,
)
from airflow_resumable.core.model.identity import Identity
from support.stores import spec_of

JOB, SLOT = "async_export", "2026-04-01T00:00:00+00:00"
#: The bound on how long a stop takes to reach a pending await (the watcher polls every 50 ms).
PROMPT = 5.0
WORKER = Path(__file__).parent / "support" / "async_kill_worker.py"


def attempt(store: Store, n: int = 1, **options: Any) -> Attempt:
    return Attempt(store, Identity(job=JOB, slot=SLOT, attempt=n, owner=f"owner-{n}"), options=Options(**options))


def row(store: Store, job: str = JOB) -> Any:
    with store.open() as s:
        return s.checkpoints.load(job, SLOT)


class AsyncItems:
    """An async handler over items 0..n-1, ``chunk`` a checkpoint; records every item it awaits.
    ``hang`` = (attempt, item): after checkpointing that item, await 60 s (the run must cut it)."""

    def __init__(self, n: int, chunk: int, *, fail: tuple[int, int] | None = None,
                 hang: tuple[int, int] | None = None):
        self.n, self.chunk, self.fail, self.hang = n, chunk, fail, hang
        self.seen: list[int] = []
        self.hanging = threading.Event()

    async def __call__(self, ctx: Any) -> int:
        i = ctx.position or 0
        ctx.total = self.n
        while i < self.n:
            batch = list(range(i, min(i + self.chunk, self.n)))
            for item in batch:
                await asyncio.sleep(0)  # the item's I/O
                self.seen.append(item)
            if self.fail == (ctx.attempt, i // self.chunk):
                raise RuntimeError(f"injected failure in chunk {i // self.chunk}")
            ctx.state["sum"] = ctx.state.get("sum", 0) + sum(batch)
            i = batch[-1] + 1
            await ctx.acheckpoint(i, processed=i)
            if self.hang == (ctx.attempt, i):
                self.hanging.set()
                await asyncio.sleep(60)
        return int(ctx.state["sum"])


def test_an_async_handler_resumes_after_a_failure_and_repeats_at_most_the_failed_chunk(store: Store) -> None:
    # Given an async handler that fails on attempt 1 in chunk 3 (after 3 checkpoints)
    work = AsyncItems(50, 5, fail=(1, 3))
    with pytest.raises(RuntimeError, match="injected"):
        attempt(store, 1).run(work)
    failed = row(store)
    assert (failed.status, failed.position, failed.processed) == ("failed", 15, 15)
    # When attempt 2 runs
    outcome = attempt(store, 2).run(work)
    # Then it resumed at chunk 3: only chunk 3's items were awaited twice, and the sum is exact
    assert outcome.resumed_from == 15 and outcome.result == sum(range(50))
    twice = sorted({i for i in work.seen if work.seen.count(i) == 2})
    assert twice == list(range(15, 20)) and set(work.seen) == set(range(50))
    assert outcome.checkpoint.status == "done"


def test_the_timeout_cancels_a_60_second_await_within_seconds_and_the_retry_resumes(store: Store) -> None:
    # Given an async handler that awaits 60 s after its 4th checkpoint, and a timeout of 1 s
    work = AsyncItems(40, 5, hang=(1, 20))
    began = time.monotonic()
    # When it runs
    with pytest.raises(Cancelled) as stopped:
        attempt(store, 1, timeout=1.0).run(work)
    # Then the pending await was cancelled within seconds, not after 60
    assert time.monotonic() - began < 1.0 + PROMPT
    assert stopped.value.reason == Reason.TIMEOUT
    cancelled = row(store)
    assert (cancelled.status, cancelled.position, cancelled.processed) == ("cancelled", 20, 20)
    assert cancelled.cancel_reason == "timeout" and cancelled.lease_owner is None
    # And the retry resumes from the last checkpoint
    outcome = attempt(store, 2).run(work)
    assert outcome.resumed_from == 20 and outcome.result == sum(range(40))
    assert [i for i in work.seen if work.seen.count(i) > 1] == []


@pytest.mark.parametrize("source", ["pause", "cancel", "shutdown", "lease_lost"])
def test_every_stop_source_cancels_the_pending_await_and_keeps_the_checkpoint(store: Store, source: str) -> None:
    # Given an async handler hanging in a 60 s await after its checkpoint at 10, with a short lease
    # whose keeper reads the requests on its heartbeats
    work = AsyncItems(30, 5, hang=(1, 10))
    run = attempt(store, 1, lease=1.0)
    errors: list[BaseException] = []

    def go() -> None:
        try:
            run.run(work)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=go)
    thread.start()
    assert work.hanging.wait(30), "the handler never reached its await"
    began = time.monotonic()
    # When the stop source fires
    if source == "pause":
        control.pause(store, JOB, SLOT, by="alice")
    elif source == "cancel":
        control.cancel(store, JOB, SLOT, by="alice")
    elif source == "shutdown":
        run.signal.cancel(Reason.SHUTDOWN, "the worker is shutting down")
    else:
        run.signal.cancel(Reason.LEASE_LOST, "another attempt took over")
    thread.join(60)
    # Then the await ended within the bound, with the source's error, the checkpoint kept at 10
    assert not thread.is_alive() and time.monotonic() - began < PROMPT
    expected = {"pause": Paused, "cancel": Cancelled, "shutdown": Cancelled, "lease_lost": LeaseLost}[source]
    assert isinstance(errors[0], expected), errors
    stored = row(store)
    assert (stored.position, stored.processed) == (10, 10)
    if source != "lease_lost":
        assert stored.status == {"pause": "paused"}.get(source, "cancelled")
        assert stored.cancel_reason == {"pause": "paused", "cancel": "requested", "shutdown": "shutdown"}[source]


def test_a_handler_that_swallows_the_cancellation_stops_at_its_next_checkpoint_and_the_log_says_so(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    # Given an async handler that catches CancelledError around its I/O and goes on
    async def stubborn(ctx: Any) -> None:
        i = ctx.position or 0
        while True:
            try:
                await asyncio.sleep(60 if i == 3 else 0)
            except asyncio.CancelledError:
                pass
            i += 1
            await ctx.acheckpoint(i, processed=i)

    # When the timeout fires during its await
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="airflow_resumable"), pytest.raises(Cancelled):
        attempt(store, 1, timeout=0.5).run(stubborn)
    # Then its next checkpoint (at 4) stopped it, saved, and the log says it ignored a cancellation
    assert time.monotonic() - began < 0.5 + PROMPT
    assert row(store).position == 4
    assert "ignored a cancellation" in caplog.text


def test_a_sync_checkpoint_from_an_async_handler_works_and_blocks_its_loop(store: Store) -> None:
    # Given an async handler calling the sync ctx.checkpoint()
    async def plain(ctx: Any) -> int:
        for i in range(1, 6):
            await asyncio.sleep(0)
            ctx.checkpoint(i, processed=i)
        return 5

    # When it runs, then every checkpoint was written
    outcome = attempt(store, 1).run(plain)
    assert (outcome.result, outcome.checkpoint.position, outcome.checkpoint.processed) == (5, 5, 5)


def test_acheckpoint_leaves_the_event_loop_free_while_the_checkpoint_is_written(store: Store) -> None:
    # Given an async handler with a ticker measuring the loop's longest stall, checkpointing 100 times
    stalls: list[float] = []

    async def measured(ctx: Any) -> None:
        stop = asyncio.Event()

        async def ticker() -> None:
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                stalls.append(now - last - 0.001)
                last = now

        tick = asyncio.ensure_future(ticker())
        for i in range(1, 101):
            await ctx.acheckpoint(i, processed=i)
        stop.set()
        await tick

    attempt(store, 1).run(measured)
    # Then the loop kept ticking: the p99 stall stays well under one write (the bound is loose: a
    # shared test machine; the benchmark measures it)
    stalls.sort()
    assert stalls and stalls[int(len(stalls) * 0.99)] < 0.05, stalls[-5:]


def test_async_read_and_process_run_in_the_chunk_loop_and_a_timeout_cuts_their_await(store: Store) -> None:
    # Given a chunk loop whose read and process are async, process hanging on attempt 1 at item 10
    seen: list[int] = []

    async def read(ctx: Any, after: int | None, limit: int) -> list[int]:
        await asyncio.sleep(0)
        first = 0 if after is None else after + 1
        return list(range(first, min(first + limit, 30)))

    async def process(ctx: Any, batch: list[int]) -> None:
        seen.extend(batch)
        if ctx.attempt == 1 and batch[0] == 10:
            await asyncio.sleep(60)

    # When attempt 1 runs with a 1 s timeout
    began = time.monotonic()
    with pytest.raises(Cancelled):
        attempt(store, 1, timeout=1.0).run(chunk_loop(read, process, chunk_size=5))
    # Then the await was cut within seconds and the checkpoint is at the last chunk before it
    assert time.monotonic() - began < 1.0 + PROMPT
    assert row(store).position == 9
    # And the retry resumes there and finishes every item
    outcome = attempt(store, 2).run(chunk_loop(read, process, chunk_size=5))
    assert outcome.resumed_from == 9 and sorted(set(seen)) == list(range(30))
    assert seen.count(10) == 2 and seen.count(9) == 1


def test_map_checkpoints_the_contiguous_low_water_mark_never_past_an_unfinished_item(store: Store) -> None:
    # Given items whose work finishes in reverse order within each window, and a handler that
    # records, at every checkpoint, which items had finished
    finished: set[int] = set()
    marks: list[tuple[int, set[int]]] = []

    async def handler(ctx: Any) -> list[Any]:
        original = ctx.acheckpoint

        async def spy(position: Any, **kw: Any) -> None:
            marks.append((position, set(finished)))
            await original(position, **kw)

        ctx.acheckpoint = spy

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


def test_a_real_process_death_mid_chunk_resumes_from_the_last_checkpoint(store: Store) -> None:
    # Given an async handler in its own process, writing each item's I/O through ctx.arun and
    # ctx.transaction() (exactly once with the checkpoint)
    with store.open() as s:
        s.ensure_schema()
        s._execute("CREATE TABLE sink (item INTEGER NOT NULL, attempt INTEGER NOT NULL)")
        s.commit()
    spec = spec_of(store)
    proc = subprocess.Popen([sys.executable, str(WORKER), spec, "60", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # When it is killed with SIGKILL after some checkpoints, mid-chunk
    deadline = time.monotonic() + 60
    while (row(store, "crash_async") is None or row(store, "crash_async").processed < 20) and proc.poll() is None:
        assert time.monotonic() < deadline, "the worker made no progress"
        time.sleep(0.005)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    killed_at = row(store, "crash_async").processed
    assert killed_at < 60
    # Then a new process resumes from the checkpoint and every item is in the sink exactly once
    final = subprocess.run([sys.executable, str(WORKER), spec, "60", "2"], capture_output=True, text=True,
                           timeout=120)
    assert final.returncode == 0, final.stderr[-2000:]
    with store.open() as s:
        cur = s.conn.cursor()
        cur.execute("SELECT count(DISTINCT item), count(*) FROM sink")
        assert cur.fetchone() == (60, 60)
        cur.execute("SELECT min(item) FROM sink WHERE attempt = 2")
        first_redone = cur.fetchone()[0]
    # and it resumed from the checkpoint, not from the start: a COMMIT the dead process had sent may
    # still have landed on the server after the kill, so the checkpoint can be later than read then
    resumed = row(store, "crash_async").resumed_from
    assert first_redone == resumed and killed_at <= resumed < 60, (first_redone, resumed, killed_at)
    assert row(store, "crash_async").status == "done"


async def sums_its_items(ctx: Any) -> int:
    """An async handler for the test kit: chunks of 3 of 12 items, a running sum in ctx.state."""
    i = ctx.position or 0
    while i < 12:
        batch = list(range(i, min(i + 3, 12)))
        await asyncio.sleep(0)
        ctx.state["sum"] = ctx.state.get("sum", 0) + sum(batch)
        i = batch[-1] + 1
        await ctx.acheckpoint(i, processed=i)
    return int(ctx.state["sum"])


async def maps_its_items(ctx: Any) -> int:
    """An async handler for the test kit: 20 items through ctx.map, finishing out of order, each
    item's effect keyed by the item (a repeated item writes the same entry again), not a running sum."""
    doubled = ctx.state.setdefault("doubled", {})

    async def double(item: int) -> None:
        await asyncio.sleep(0.001 * (item % 3))
        doubled[str(item)] = item * 2

    start = 0 if ctx.position is None else ctx.position + 1
    await ctx.map(range(start, 20), double, limit=4, every=2)
    return sum(doubled.values())


@pytest.mark.parametrize("handler", [sums_its_items, maps_its_items], ids=["acheckpoint", "map"])
def test_the_test_kit_proves_an_async_handler_under_every_interruption_a_real_crash_included(handler: Any) -> None:
    from airflow_resumable.testing import check_resumable

    # Given an async handler; when the kit interrupts it at each checkpoint by each kind (process death too)
    report = check_resumable(handler, seed=1)
    # Then every trial resumed to the uninterrupted run's result
    assert report.ok, report.failures
    assert {t.interruption.value for t in report.trials} >= {"process_death", "timeout", "cancel", "pause_resume"}


def test_the_connection_s_calls_from_the_event_loop_are_refused_and_work_through_arun(store: Store) -> None:
    # Given an async handler that writes through ctx.transaction() on its event loop, then through ctx.arun
    refused: list[str] = []

    async def handler(ctx: Any) -> Any:
        try:
            ctx.transaction()
        except Exception as exc:  # the refusal names the way out
            refused.append(str(exc))
        await ctx.arun(lambda: ctx.transaction().execute("CREATE TABLE IF NOT EXISTS sink (item INTEGER)"))
        await ctx.arun(lambda: ctx.transaction().execute("INSERT INTO sink (item) VALUES (%s)", (1,)))
        await ctx.acheckpoint(1, processed=1)
        return ctx.previous  # read on the attempt's thread

    # When it runs
    outcome = attempt(store, 1).run(handler)
    # Then the loop's call was refused saying what to do, and the write through arun committed
    assert refused and "await ctx.arun(fn, ...)" in refused[0]
    assert outcome.result is None and outcome.checkpoint.status == "done"
    with store.open() as s:
        assert [tuple(r) for r in s.execute("SELECT item FROM sink").fetchall()] == [(1,)]


def test_sigterm_cancels_the_pending_await_of_an_async_handler_in_a_real_process(store: Store) -> None:
    # Given an async handler in its own process, awaiting 60 s after its checkpoint at 6
    with store.open() as s:
        s.ensure_schema()
        s._execute("CREATE TABLE sink (item INTEGER NOT NULL, attempt INTEGER NOT NULL)")
        s.commit()
    proc = subprocess.Popen([sys.executable, str(WORKER), spec_of(store), "30", "1", "6"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while (row(store, "crash_async") is None or row(store, "crash_async").processed < 6) and proc.poll() is None:
        assert time.monotonic() < deadline, "the worker made no progress"
        time.sleep(0.005)
    # When the process receives SIGTERM (the handler running on the main thread's signal handler)
    time.sleep(0.1)  # well inside the await
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    # Then it stopped within seconds as cancelled, the checkpoint at 6 and the reason on the row
    assert proc.returncode == 3, err[-2000:]
    assert time.monotonic() - began < PROMPT
    stopped = row(store, "crash_async")
    assert (stopped.status, stopped.position, stopped.cancel_reason) == ("cancelled", 6, "shutdown")
    assert stopped.lease_owner is None


def test_a_cpu_bound_second_inside_an_async_handler_does_not_cost_the_lease(store: Store) -> None:
    # Given an async handler that blocks its loop with 2 s of CPU-bound work, under a 0.6 s lease
    beats: list[Any] = []

    async def careless(ctx: Any) -> None:
        await ctx.acheckpoint(1, processed=1)
        beats.append(row(store).heartbeat_at)
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            sum(range(1000))
        beats.append(row(store).heartbeat_at)  # read before anything yields to the loop
        await ctx.acheckpoint(2, processed=2)

    # When it runs
    outcome = attempt(store, 1, lease=0.6).run(careless)
    # Then the lease keeper's thread heartbeat while the loop was blocked, and the run finished
    assert outcome.checkpoint.status == "done" and outcome.checkpoint.position == 2
    assert None not in beats and (beats[1] - beats[0]).total_seconds() >= 1.0, beats
