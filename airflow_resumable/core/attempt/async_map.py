"""``ctx.map()``: a chunk's items run concurrently, at most ``limit`` at once, and the checkpoint saved
at their **contiguous low-water mark**: never past an item that has not finished, whatever order they
finish in. A crash repeats at most the items in flight; the items past the mark that had finished are
named in the saved state (:data:`MAP_DONE`), so a resumed attempt does not run them again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Sequence
from typing import Any

from airflow_resumable.core.attempt.async_bridge import hold_cancels, release_cancels
from airflow_resumable.core.model.checkpoint import ENCODER
from airflow_resumable.core.model.errors import Cancelled, ConfigurationError, ResumableError

__all__ = ["MAP_DONE", "map_items"]

#: The key of a checkpoint's state, saved by ``ctx.map``, naming the items past the saved position
#: that had finished (never part of ``ctx.state`` itself; see :func:`map_items`).
MAP_DONE = "resumable_map_done"


def _out_of_order(keys: Sequence[Any]) -> int | None:
    """The index of the first position that is not after the one before it (None: all in order).
    Positions that do not compare (dicts) are only checked to be distinct."""
    try:
        for i in range(1, len(keys)):
            if not keys[i - 1] < keys[i]:
                return i
        return None
    except TypeError:
        seen: set[str] = set()
        for i, k in enumerate(keys):
            text = ENCODER.encode(k)
            if text in seen:
                return i
            seen.add(text)
        return None


async def map_items(ctx: Any, items: Iterable[Any] | AsyncIterable[Any], fn: Callable[[Any], Awaitable[Any]], *,
                    limit: int, key: Callable[[Any], Any], every: int | None,
                    skip_on: tuple[type[Exception], ...] | None, skip_limit: int) -> list[Any]:
    """``ctx.map()`` (``ctx`` is the :class:`~airflow_resumable.core.attempt.context.RunContext`, which
    imports this module): run ``fn(item)`` for every item, at most ``limit`` at once, saving the
    contiguous low-water mark (see :meth:`~airflow_resumable.core.attempt.context.RunContext.map`).

    Each save also names the items past the mark that finished (:data:`MAP_DONE` in the saved
    state): their effects on ``ctx.state`` are in the state saved with them, so the attempt that
    resumes from it does not run them again (``ctx.state`` counts every item once).

    Raises:
        ConfigurationError: two items' positions are not in increasing order (a mark saved past an
            item later in the list would skip it after a crash).
    """
    if isinstance(items, AsyncIterable):
        todo: Sequence[Any] = [item async for item in items]
    else:
        todo = items if isinstance(items, Sequence) else list(items)
    count = len(todo)
    keys = [key(item) for item in todo]
    bad = _out_of_order(keys)
    if bad is not None:
        raise ConfigurationError(
            f"ctx.map() takes items in position order, each after the one before, but the item at index {bad} "
            f"has position {keys[bad]!r} after {keys[bad - 1]!r}: a saved mark past one of them would skip the "
            "other after a crash", job=ctx.job, slot=ctx.slot,
            hint="Sort the items by position and drop duplicates, or pass position=<function of an item> "
            "giving each item a unique position that grows along the list")
    every = limit if every is None else every
    results: list[Any] = [None] * count
    finished = [False] * count
    base = ctx.processed
    done_before = ctx._take_map_done()  # finished past the mark by the attempt this one resumes
    if done_before:
        for i, k in enumerate(keys):
            if ENCODER.encode(k) in done_before:
                finished[i] = True
    mark = saved = started = 0  # todo[:mark] finished; todo[:saved] saved; todo[:started] started
    running: dict[asyncio.Future[Any], int] = {}

    async def collect() -> None:
        """Take in every item that ended: its result, its skip, or its error (raised)."""
        while ended := [task for task in running if task.done()]:
            for task in ended:
                i = running.pop(task)
                error = None if task.cancelled() else task.exception()
                if task.cancelled():
                    error = RuntimeError(f"item at position {keys[i]!r} cancelled itself")
                if error is None:
                    results[i] = task.result()
                elif skip_on is not None and isinstance(error, skip_on) and not isinstance(
                        error, (Cancelled, ResumableError)):  # never skipped, as the chunk loop's policy
                    await ctx.arun(ctx.skip, todo[i], position=keys[i], error=error, limit=skip_limit)
                else:
                    raise error
                finished[i] = True

    def advance() -> None:
        nonlocal mark
        while mark < count and finished[mark]:
            mark += 1

    async def save() -> None:
        """Save the mark, naming the items past it that finished (written as the state is, at the call)."""
        nonlocal saved
        beyond = [keys[i] for i in range(mark, min(started, count)) if finished[i]]
        await ctx._asave_mark(keys[mark - 1], processed=base + mark, done=beyond)
        saved = mark

    async def stop_running() -> None:
        asked = {task for task in running if task.cancel()}
        if running:
            await asyncio.wait(list(running))
        swallowed = []
        for task, i in list(running.items()):  # ended before the cancellation reached it: its effects stand
            if task.cancelled() or task.exception() is not None:
                continue
            if task in asked:  # it caught the CancelledError and returned: its work was cut, not finished
                swallowed.append(keys[i])
                continue
            results[i], finished[i] = task.result(), True
        running.clear()
        if swallowed:
            ctx.log.warning(
                "ctx.map(): the items at positions %s caught the cancellation and returned; they count as not "
                "finished (the retry runs them again). Let CancelledError propagate [job=%s slot=%s]",
                swallowed[:10], ctx.job, ctx.slot)

    try:
        advance()
        while mark < count:
            # The window: no item starts more than `limit` items ahead of the mark, so a crash
            # repeats at most the window (plus what finished since the last save).
            while started < count and started < mark + limit:
                if not finished[started]:
                    running[asyncio.ensure_future(fn(todo[started]))] = started
                started += 1
            if running:
                await asyncio.wait(list(running), return_when=asyncio.FIRST_COMPLETED)
                await collect()
            advance()
            if mark - saved >= every:
                await save()
    except asyncio.CancelledError:
        # A stop source: the items before the mark are done; keep them, then stop (the checkpoint raises).
        await stop_running()
        advance()
        if mark > saved and ctx.signal.cancelled:
            current = asyncio.current_task()
            if current is not None:
                hold_cancels(current)
            try:
                await save()
            finally:
                if current is not None:
                    release_cancels(current)
        raise
    except BaseException:
        await stop_running()
        raise
    if mark > saved:
        await save()
    return results
