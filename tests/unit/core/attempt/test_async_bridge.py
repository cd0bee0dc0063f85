"""``async def`` handlers: the same attempt, driven on an event loop of its own.

Given / When / Then, against both stores: resume after a failure and after a real process death,
every stop source cancelling a pending await within a bounded time, a checkpoint that never blocks
the loop (``ctx.map`` is in test_async_map.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from airflow_resumable.core import (
    Attempt,
    AttemptEnded,
    Cancelled,
    ConfigurationError,
    LeaseLost,
    Options,
    Paused,
    Reason,
    Signal,
    SQLiteStore,
    Store,
    chunk_loop,
    control,
)
from airflow_resumable.core.attempt import async_bridge
from airflow_resumable.core.model.identity import Identity
from support.paths import SUPPORT
from support.stores import spec_of

JOB, SLOT = "async_export", "2026-04-01T00:00:00+00:00"
#: The bound on how long a stop takes to reach a pending await (the watcher is woken by the signal).
PROMPT = 5.0
WORKER = SUPPORT / "async_kill_worker.py"


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


def test_an_async_handler_that_finishes_inside_its_timeout_ends_done(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an async handler whose run has a timeout it never reaches: the watcher then wakes to look
    # at the deadline (every 10 ms here) while the handler awaits (on Python 3.11 asyncio.wait_for
    # made each of those sleeps a task of its own, which the left-behind check blamed on the handler)
    monkeypatch.setattr(async_bridge, "DEADLINE_CHECK", 0.01)
    work = AsyncItems(20, 5)

    async def slow(ctx: Any) -> int:
        result = await work(ctx)
        await asyncio.sleep(0.3)  # the watcher looks ~30 times meanwhile
        return result

    # When it runs to its end
    outcome = attempt(store, 1, timeout=600.0).run(slow)
    # Then it ends done with every item, and no task is blamed on it
    assert outcome.checkpoint.status == "done" and outcome.result == sum(range(20))


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


def _hold_the_row(store: Store) -> Any:
    """Another connection holding the slot's row (SQLite: the database's write lock; PostgreSQL: the
    row's lock), so that a checkpoint's write waits on the database until it is released."""
    if isinstance(store, SQLiteStore):
        import sqlite3

        conn = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN IMMEDIATE")
        return conn
    import psycopg2

    conn = psycopg2.connect(**store._params)
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM resumable_checkpoints WHERE job = %s AND slot = %s FOR UPDATE", (JOB, SLOT))
    return conn


def test_acheckpoint_leaves_the_event_loop_free_while_the_checkpoint_is_written(store: Store) -> None:
    # Given an async handler whose second checkpoint's write waits on the database (another
    # connection holds the row), and a ticker task on its event loop
    seen: dict[str, Any] = {}

    async def measured(ctx: Any) -> None:
        await ctx.acheckpoint(0, processed=0)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        holder = _hold_the_row(store)
        backstop = threading.Timer(60, holder.rollback)  # were the loop blocked, the write still ends
        backstop.start()
        tick = asyncio.ensure_future(ticker())
        write = asyncio.ensure_future(ctx.acheckpoint(1, processed=1))
        try:
            # When the write is in flight: the loop keeps running other tasks meanwhile
            deadline = time.monotonic() + 60
            while ticks < 50 and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            seen["ticked 50 times while the write waited"] = ticks >= 50
            seen["write done before the row was released"] = write.done()
        finally:
            backstop.cancel()
            holder.rollback()
            holder.close()
        await write
        tick.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tick

    attempt(store, 1).run(measured)
    # Then the ticker ran 50 times while the write waited on the database, and the write completed after
    assert seen == {"ticked 50 times while the write waited": True, "write done before the row was released": False}
    assert row(store).position == 1


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


async def totals_its_items(ctx: Any) -> int:
    """An async handler for the test kit: 20 items through ctx.map, finishing out of order, each
    adding to a running total in ctx.state (a resumed run must count every item once)."""
    ctx.state.setdefault("total", 0)

    async def add(item: int) -> None:
        await asyncio.sleep(0.001 * (item % 3))
        ctx.state["total"] += item

    start = 0 if ctx.position is None else ctx.position + 1
    await ctx.map(range(start, 20), add, limit=4, every=2)
    return int(ctx.state["total"])


@pytest.mark.parametrize("handler", [sums_its_items, maps_its_items, totals_its_items],
                         ids=["acheckpoint", "map", "map-total"])
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


def test_a_checkpoint_from_a_sync_handler_s_own_thread_works_on_postgres_and_is_refused_clearly_on_sqlite(
        store: Store) -> None:
    # Given a sync handler that checkpoints from a worker thread of its own
    def handler(ctx: Any) -> str:
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="worker") as pool:
            pool.submit(ctx.checkpoint, 1, processed=1).result()
        return "ok"

    # When it runs
    if isinstance(store, SQLiteStore):
        # Then on SQLite (a connection bound to the attempt's thread) it is refused before anything
        # is written, naming the job, the slot and what to do
        with pytest.raises(ConfigurationError) as refused:
            attempt(store, 1).run(handler)
        text = str(refused.value)
        assert f"job={JOB!r}" in text and f"slot={SLOT!r}" in text and "worker" in text
        assert "from the handler's own thread" in text and "async def" in text
        assert row(store).position is None
    else:
        # Then on PostgreSQL it is written (the attempt serializes its saves)
        outcome = attempt(store, 1).run(handler)
        assert (outcome.result, outcome.checkpoint.position) == ("ok", 1)


def test_checkpoints_from_an_async_handler_s_threads_are_written_by_the_attempt_s_thread(store: Store) -> None:
    # Given an async handler that checkpoints from asyncio.to_thread and from a thread it starts
    async def handler(ctx: Any) -> str:
        await asyncio.to_thread(ctx.checkpoint, 1, processed=1)
        failed: list[BaseException] = []

        def work() -> None:
            try:
                ctx.checkpoint(2, processed=2)
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=work, name="own")
        thread.start()
        await asyncio.to_thread(thread.join, 30)
        assert not thread.is_alive() and not failed, failed
        return "ok"

    # When it runs, then both were saved (on SQLite too: run on the attempt's thread)
    outcome = attempt(store, 1).run(handler)
    assert (outcome.result, outcome.checkpoint.position, outcome.checkpoint.processed) == ("ok", 2, 2)


def test_a_thread_left_running_by_an_async_handler_is_refused_after_it_returned_never_left_waiting(
        store: Store) -> None:
    # Given an async handler that leaves a thread behind, checkpointing once the handler returned
    returned = threading.Event()
    outcome_of_thread: list[BaseException | None] = []

    def late(ctx: Any) -> None:
        assert returned.wait(30)
        try:
            ctx.checkpoint(9, processed=9)
            outcome_of_thread.append(None)
        except BaseException as exc:
            outcome_of_thread.append(exc)

    async def handler(ctx: Any) -> str:
        threading.Thread(target=late, args=(ctx,), daemon=True, name="late").start()
        return "ok"

    # When the handler returns
    outcome = attempt(store, 1).run(handler)
    returned.set()
    deadline = time.monotonic() + 30
    while not outcome_of_thread:
        assert time.monotonic() < deadline, "the late thread's checkpoint never returned"
        time.sleep(0.01)
    # Then its checkpoint was refused (nothing written), not left waiting for a thread that serves no more
    assert isinstance(outcome_of_thread[0], (AttemptEnded, ConfigurationError)), outcome_of_thread
    assert outcome.checkpoint.position is None and row(store).status == "done"


class CountedSignal(Signal):
    """A signal that notes when the event loop's thread reads it (the watcher's wake-ups)."""

    reads: list[float]

    @property
    def cancelled(self) -> bool:
        if threading.current_thread().name.startswith("resumable-async-"):
            self.reads.append(time.monotonic())
        return super().cancelled


def counted(run: Attempt) -> list[float]:
    """The times the watcher of ``run``'s async handler reads its signal."""
    run.signal.__class__ = CountedSignal
    reads = run.signal.reads = []  # type: ignore[attr-defined]
    return reads


def test_the_watcher_sleeps_until_a_stop_and_the_stop_reaches_the_await_promptly(store: Store) -> None:
    # Given an async handler awaiting 60 s, and the watcher's looks at the signal counted
    awaiting, cut = threading.Event(), []

    async def handler(ctx: Any) -> None:
        awaiting.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cut.append(time.monotonic())
            raise

    run = attempt(store, 1)
    wakes = counted(run)
    errors: list[BaseException] = []

    def go() -> None:
        try:
            run.run(handler)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=go)
    thread.start()
    assert awaiting.wait(30), "the handler never reached its await"
    quiet_from = time.monotonic()
    # When nothing happens for a second, then the watcher did not wake (it waits on events)
    thread.join(1.0)
    assert thread.is_alive()
    assert len([t for t in wakes if t >= quiet_from]) <= 2, len(wakes)
    # When another thread raises the signal, then the await is cut promptly (no poll interval to wait out)
    began = time.monotonic()
    run.signal.cancel(Reason.SHUTDOWN, "the worker is shutting down")
    thread.join(60)
    assert not thread.is_alive() and isinstance(errors[0], Cancelled), errors
    assert cut and cut[0] - began < 1.0, cut[0] - began


def test_the_timeout_reaches_a_pending_await_at_its_deadline_without_polling(store: Store) -> None:
    # Given an async handler awaiting 60 s under a 1.5 s timeout, the watcher's looks at the signal counted
    cut: list[float] = []

    async def handler(ctx: Any) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cut.append(time.monotonic())
            raise

    run = attempt(store, 1, timeout=1.5)
    wakes = counted(run)
    began = time.monotonic()
    # When it runs
    with pytest.raises(Cancelled) as stopped:
        run.run(handler)
    # Then the await was cut at the deadline, by a watcher that woke a few times, not 20 a second
    assert stopped.value.reason == Reason.TIMEOUT
    assert cut and 1.5 <= cut[0] - began < 1.5 + 1.0, cut[0] - began
    assert len(wakes) <= 12, len(wakes)
