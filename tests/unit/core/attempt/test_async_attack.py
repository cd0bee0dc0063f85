"""Async handlers attacked as a hostile user would (issue 35): each test failed before its fix.

Given / When / Then, on both stores: what a handler can reach (the loop, ctx from another loop or
thread, tasks it leaves running, a cancellation it swallows), ``ctx.map``'s odd arguments and the
hand-edited row, and a stop request a handler ignores for good. None ends ``done`` over work not done.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from airflow_resumable.core import (
    Attempt,
    Cancelled,
    ConfigurationError,
    InvalidCheckpoint,
    Options,
    Reason,
    Store,
    chunk_loop,
)
from airflow_resumable.core.attempt import async_bridge
from airflow_resumable.core.model.identity import Identity

JOB, SLOT = "async_attack", "2026-04-01T00:00:00+00:00"
#: A bound on how long a stop takes to end the attempt (a shared test machine; never a timing claim).
PROMPT = 10.0


def attempt(store: Store, n: int = 1, **options: Any) -> Attempt:
    return Attempt(store, Identity(job=JOB, slot=SLOT, attempt=n, owner=f"owner-{n}"), options=Options(**options))


def row(store: Store) -> Any:
    with store.open() as s:
        return s.checkpoints.load(JOB, SLOT)


def names_the_run(error: BaseException) -> None:
    text = str(error)
    assert f"job={JOB!r}" in text and f"slot={SLOT!r}" in text, text


def running(run: Attempt, handler: Any) -> tuple[threading.Thread, list[Any]]:
    """``run.run(handler)`` on a thread of its own; the list gets its outcome or its error."""
    out: list[Any] = []

    def go() -> None:
        try:
            out.append(run.run(handler))
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, out


# -- a cancellation swallowed -------------------------------------------------------------------


def test_a_handler_that_swallows_a_cancellation_taken_during_a_call_is_still_cut_at_its_next_await(
        store: Store) -> None:
    # Given an async handler whose ctx.arun call is under way when the run is asked to stop, and
    # which swallows the CancelledError that follows, then awaits 30 s
    run = attempt(store, 1)
    cut = threading.Event()

    async def handler(ctx: Any) -> None:
        def stop_during_the_call() -> None:
            run.signal.cancel(Reason.SHUTDOWN, "the worker is shutting down")
            time.sleep(0.2)  # the call is still under way when the watcher cancels the handler

        try:
            await ctx.arun(stop_during_the_call)
        except asyncio.CancelledError:
            pass
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cut.set()
            raise

    # When it runs
    thread, out = running(run, handler)
    thread.join(PROMPT)
    # Then the 30 s await was cancelled again (as for any handler that ignores a cancellation), and the run stopped
    assert cut.is_set() and not thread.is_alive(), out
    assert isinstance(out[0], Cancelled) and row(store).status == "cancelled", out


def test_a_handler_that_swallows_the_stop_and_returns_ends_stopped_not_done_and_the_retry_resumes(
        store: Store) -> None:
    # Given an async handler that checkpoints at 1, then catches the CancelledError of its next await and returns
    awaited: list[int] = []

    async def handler(ctx: Any) -> str:
        if ctx.position is None:
            await ctx.acheckpoint(1, processed=1)
        awaited.append(ctx.attempt)
        try:
            await asyncio.sleep(30 if ctx.attempt == 1 else 0)
        except asyncio.CancelledError:
            pass  # the request it was making is cut, and it returns as if it were done
        return "ok"

    # When the timeout cuts the await
    with pytest.raises(Cancelled) as stopped:
        attempt(store, 1, timeout=0.5).run(handler)
    # Then the attempt ends with the stop, not "done" (the work cut is not done)
    assert stopped.value.reason == Reason.TIMEOUT
    stopped_row = row(store)
    assert (stopped_row.status, stopped_row.position, stopped_row.cancel_reason) == ("cancelled", 1, "timeout")
    # And the retry resumes from the checkpoint and does the work
    outcome = attempt(store, 2).run(handler)
    assert outcome.resumed_from == 1 and outcome.checkpoint.status == "done" and awaited == [1, 2]


def test_an_async_process_that_swallows_the_stop_is_not_checkpointed_past_its_chunk(store: Store) -> None:
    # Given a chunk loop whose async process swallows the cancellation of its await on chunk 2 (items 4, 5)
    done: list[int] = []

    async def read(ctx: Any, after: int | None, limit: int) -> list[int]:
        first = 0 if after is None else after + 1
        return list(range(first, min(first + limit, 10)))

    async def process(ctx: Any, batch: list[int]) -> None:
        try:
            await asyncio.sleep(30 if ctx.attempt == 1 and batch[0] == 4 else 0)
        except asyncio.CancelledError:
            return  # cut, not done
        done.extend(batch)

    # When the timeout cuts it
    with pytest.raises(Cancelled):
        attempt(store, 1, timeout=0.5).run(chunk_loop(read, process, chunk_size=2))
    # Then the checkpoint stays before the chunk it cut, and the retry does that chunk
    assert row(store).position == 3
    outcome = attempt(store, 2).run(chunk_loop(read, process, chunk_size=2))
    assert outcome.resumed_from == 3 and sorted(done) == list(range(10))


def test_a_handler_that_ignores_every_cancellation_is_left_behind_and_the_attempt_ends_stopped(
        store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Given an async handler that catches every CancelledError and awaits again, and never checkpoints
    # (re-cancelled every 0.1 s, given up on after 3 ignored: the defaults are 1 s and 10)
    monkeypatch.setattr(async_bridge, "RECANCEL", 0.1)
    monkeypatch.setattr(async_bridge, "ABANDON_AFTER", 3)
    run = attempt(store, 1)
    awaiting = threading.Event()

    async def deaf(ctx: Any) -> None:
        await ctx.acheckpoint(1, processed=1)
        while True:
            awaiting.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                pass

    thread, out = running(run, deaf)
    assert awaiting.wait(30), "the handler never reached its await"
    # When a person cancels the run
    with caplog.at_level(logging.ERROR, logger="airflow_resumable"):
        run.signal.cancel(Reason.REQUESTED, "cancel requested by alice")
        thread.join(PROMPT)
    # Then the request is carried out: the attempt ends cancelled at its checkpoint, and the log says why
    assert not thread.is_alive(), "the attempt waited for a handler that never lets go"
    assert isinstance(out[0], Cancelled), out
    stopped = row(store)
    assert (stopped.status, stopped.position, stopped.lease_owner) == ("cancelled", 1, None)
    assert "ignored 3 cancellations" in caplog.text and f"job={JOB}" in caplog.text


# -- tasks and loops the handler reaches ---------------------------------------------------------


def test_a_handler_that_returns_with_its_tasks_still_running_fails_not_done(store: Store) -> None:
    # Given an async handler that starts a task for its work and returns without awaiting it
    finished: list[str] = []

    async def handler(ctx: Any) -> str:
        async def export_rest() -> None:
            await asyncio.sleep(1)
            finished.append("rest")

        asyncio.ensure_future(export_rest())
        return "ok"

    # When it runs
    with pytest.raises(ConfigurationError) as refused:
        attempt(store, 1).run(handler)
    # Then the attempt failed (the task was cut, so the run is not done), naming the task and what to do
    names_the_run(refused.value)
    assert "export_rest" in str(refused.value) and "asyncio.gather" in str(refused.value)
    assert row(store).status == "failed" and finished == []


def test_an_async_process_that_leaves_a_task_running_is_not_checkpointed_past_its_chunk(store: Store) -> None:
    # Given a chunk loop whose async process hands its items to a task it does not await
    async def read(ctx: Any, after: int | None, limit: int) -> list[int]:
        first = 0 if after is None else after + 1
        return list(range(first, min(first + limit, 6)))

    async def process(ctx: Any, batch: list[int]) -> None:
        async def send() -> None:
            await asyncio.sleep(1)

        asyncio.ensure_future(send())

    # When it runs, then the first chunk fails instead of being saved while its work was still running
    with pytest.raises(ConfigurationError, match="send"):
        attempt(store, 1).run(chunk_loop(read, process, chunk_size=2))
    assert row(store).position is None and row(store).status == "failed"


def test_acheckpoint_and_arun_on_a_loop_of_the_handler_s_own_thread_run_on_the_attempt_s_thread(
        store: Store) -> None:
    # Given an async handler that runs another event loop in a thread of its own, and from there
    # awaits ctx.acheckpoint and ctx.arun (a transaction's write)
    async def handler(ctx: Any) -> str:
        async def elsewhere() -> None:
            await ctx.arun(lambda: ctx.transaction().execute("CREATE TABLE IF NOT EXISTS sink (item INTEGER)"))
            await ctx.arun(lambda: ctx.transaction().execute("INSERT INTO sink (item) VALUES (%s)", (1,)))
            await ctx.acheckpoint(1, processed=1)

        await asyncio.to_thread(asyncio.run, elsewhere())
        return "ok"

    # When it runs, then both went to the attempt's thread (SQLite's connection is bound to it), and committed
    outcome = attempt(store, 1).run(handler)
    assert (outcome.result, outcome.checkpoint.position, outcome.checkpoint.status) == ("ok", 1, "done")
    with store.open() as s:
        assert [tuple(r) for r in s.execute("SELECT item FROM sink").fetchall()] == [(1,)]


# -- ctx.map: its positions, its checkpoints, its arguments ---------------------------------------


@pytest.mark.parametrize("items", [[5, 3, 4], [(1, "a"), (1, "b"), (2, "c")], [{"id": {"k": 1}}, {"id": {"k": 1}}]],
                         ids=["unsorted", "duplicate", "duplicate-unordered-type"])
def test_map_refuses_items_out_of_position_order_before_running_any(store: Store, items: list[Any]) -> None:
    # Given items whose positions do not grow along the list (a mark past one would skip another)
    ran: list[Any] = []

    async def handler(ctx: Any) -> Any:
        async def work(item: Any) -> None:
            ran.append(item)

        return await ctx.map(items, work, limit=1, every=1)

    # When the map is called, then it is refused before any item runs, naming the run and what to do
    with pytest.raises(ConfigurationError) as refused:
        attempt(store, 1).run(handler)
    names_the_run(refused.value)
    assert "position order" in str(refused.value) and "position=" in str(refused.value)
    assert ran == [] and row(store).position is None


@pytest.mark.parametrize("how", ["acheckpoint", "checkpoint-from-a-thread"])
def test_a_checkpoint_from_an_item_of_map_is_refused_never_saved_past_an_unfinished_item(
        store: Store, how: str) -> None:
    # Given a map whose items checkpoint their own position, item 0 the slowest
    async def handler(ctx: Any) -> Any:
        async def work(item: int) -> None:
            await asyncio.sleep(0.05 if item == 0 else 0)
            if how == "acheckpoint":
                await ctx.acheckpoint(item)
            else:
                await asyncio.to_thread(ctx.checkpoint, item)

        return await ctx.map(range(10), work, limit=5)

    # When it runs, then the item's checkpoint is refused (it would pass item 0, still running)
    with pytest.raises(ConfigurationError) as refused:
        attempt(store, 1).run(handler)
    names_the_run(refused.value)
    assert "while ctx.map() runs" in str(refused.value) and "after ctx.map() returns" in str(refused.value)
    assert row(store).position is None


def test_a_map_inside_a_map_is_refused(store: Store) -> None:
    # Given a map whose items run a ctx.map of their own (both would save the slot's one position)
    async def handler(ctx: Any) -> Any:
        async def part(i: int) -> None:
            await asyncio.sleep(0)

        async def work(item: int) -> None:
            await ctx.map(range(100, 105), part, limit=2)

        return await ctx.map(range(10), work, limit=5)

    # When it runs, then the inner map is refused, naming the way out
    with pytest.raises(ConfigurationError) as refused:
        attempt(store, 1).run(handler)
    names_the_run(refused.value)
    assert "another ctx.map()" in str(refused.value) and "asyncio.gather" in str(refused.value)


def test_an_item_that_swallows_the_stop_is_not_counted_finished_and_the_retry_runs_it(store: Store) -> None:
    # Given a map one item at a time, whose item 3 asks the run to stop, then swallows the
    # CancelledError of its await and returns (its work cut)
    run = attempt(store, 1)
    done: list[int] = []

    async def handler(ctx: Any) -> Any:
        async def work(item: int) -> None:
            if ctx.attempt == 1 and item == 3:
                run.signal.cancel(Reason.SHUTDOWN, "the worker is shutting down")
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    return
            await asyncio.sleep(0)
            done.append(item)

        start = 0 if ctx.position is None else ctx.position + 1
        return await ctx.map(range(start, 10), work, limit=1, every=1)

    # When the stop comes
    with pytest.raises(Cancelled):
        run.run(handler)
    # Then the mark stays before item 3, and the retry runs it
    assert row(store).position == 2
    attempt(store, 2).run(handler)
    assert sorted(done) == list(range(10))


def test_map_takes_an_async_iterator_a_generator_an_empty_list_and_a_huge_limit(store: Store) -> None:
    # Given maps over an async generator, a generator and an empty list, one with a huge limit
    async def handler(ctx: Any) -> Any:
        async def numbers() -> Any:
            for i in range(5):
                await asyncio.sleep(0)
                yield i

        async def double(i: int) -> int:
            await asyncio.sleep(0)
            return i * 2

        first = await ctx.map(numbers(), double, limit=2)
        second = await ctx.map((i for i in range(5, 8)), double, limit=2**62)
        return first, second, await ctx.map([], double)

    # When it runs, then each gave its results in order and the last save is the last item
    outcome = attempt(store, 1).run(handler)
    assert outcome.result == ([0, 2, 4, 6, 8], [10, 12, 14], [])
    assert (outcome.checkpoint.position, outcome.checkpoint.processed) == (7, 8)


def test_the_map_s_own_state_key_is_refused_in_the_handler_s_state(store: Store) -> None:
    # Given a handler whose own state uses the key ctx.map saves its finished items under
    async def handler(ctx: Any) -> None:
        ctx.state["resumable_map_done"] = ["mine"]
        await ctx.acheckpoint(1)

    # When it checkpoints, then it is refused (a resume would take it for ctx.map's and drop it), nothing written
    with pytest.raises(InvalidCheckpoint) as refused:
        attempt(store, 1).run(handler)
    names_the_run(refused.value)
    assert "resumable_map_done" in str(refused.value) and row(store).position is None


@pytest.mark.parametrize("moved", [False, True], ids=["as-saved", "position-moved-back-by-hand"])
def test_the_items_a_save_names_finished_are_skipped_only_from_the_position_they_were_saved_with(
        store: Store, moved: bool) -> None:
    # Given a row at position 5 whose state names items 7 and 8 as finished past it (as ctx.map saves it)
    async def crash(ctx: Any) -> None:
        await ctx.acheckpoint(5, processed=6)
        raise RuntimeError("crash")

    with pytest.raises(RuntimeError, match="crash"):
        attempt(store, 1).run(crash)
    with store.open() as s:
        s.execute("UPDATE resumable_checkpoints SET state = %s WHERE job = %s",
                  ('{"resumable_map_done": {"after": 5, "done": [7, 8]}}', JOB))
        if moved:  # a person moves the position back by hand, to have items 4 and on done again
            s.execute("UPDATE resumable_checkpoints SET position = %s WHERE job = %s", ("3", JOB))
        s.commit()
    ran: list[int] = []

    async def resume(ctx: Any) -> None:
        async def work(i: int) -> None:
            ran.append(i)

        await ctx.map(range(ctx.position + 1, 10), work, limit=4)

    # When the next attempt resumes
    outcome = attempt(store, 2).run(resume)
    # Then items 7 and 8 are not run again from the position they were saved with, and are from any other
    assert outcome.resumed_from == (3 if moved else 5)
    assert sorted(ran) == ([4, 5, 6, 7, 8, 9] if moved else [6, 9])
    assert "resumable_map_done" not in outcome.checkpoint.state
