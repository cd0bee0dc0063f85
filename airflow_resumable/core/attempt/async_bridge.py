"""Async handlers: ``async def`` handlers and chunk functions, driven by an event loop of the attempt's own.

The attempt calls a handler as it calls any; when the call gives back a coroutine, an
:class:`AsyncBridge` runs it. The bridge keeps two threads apart:

- the **event loop** runs on a thread of its own, with the handler's coroutine and a watcher;
- the **attempt's thread** (the one that opened the checkpoint database's connection, which a
  SQLite connection requires) waits for the handler and meanwhile runs the store calls the loop
  hands it: ``await ctx.acheckpoint(...)`` and ``await ctx.arun(fn)``. A checkpoint's write never
  runs on the loop, so the loop is never blocked by it.

The watcher reads the run's signal every :data:`POLL` seconds. Once any stop source raised it
(timeout, a cancel or pause request, SIGTERM, a lost lease), it cancels the handler's task: the
pending ``await`` raises ``asyncio.CancelledError`` at once, and the attempt ends as a sync handler
stopped at a checkpoint does (:class:`~airflow_resumable.core.model.errors.Cancelled`, ``Paused`` or
``LeaseLost``, the reason on the row). A handler that catches the cancellation and goes on is
cancelled again every :data:`RECANCEL` seconds, the log says it ignored one, and its next
checkpoint stops it.

The chunk loop (:func:`~airflow_resumable.core.work.chunk_loop.chunk_loop`) calls async ``read``/``process``
through :meth:`AsyncBridge.call`: the loop itself stays the synchronous one, on the attempt's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import queue
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_resumable.core.attempt.reporter import Log
from airflow_resumable.core.attempt.signal import Signal
from airflow_resumable.core.model.errors import Cancelled, ConfigurationError, ResumableError

#: How often the watcher reads the signal: the bound on how long a stop takes to reach the await.
POLL = 0.05
#: How long a handler may ignore a cancellation before it is cancelled again (and the log says so).
RECANCEL = 1.0

#: The bridge whose loop runs the current task (set in every task the bridge starts).
_BRIDGE: contextvars.ContextVar[AsyncBridge | None] = contextvars.ContextVar("resumable_bridge", default=None)
#: Tasks that caught a cancellation on purpose to finish a checkpoint in flight (not "ignored").
_FINISHING: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
#: What the attempt's thread takes off its queue to look at its future again.
_WAKE = object()


def current_bridge() -> AsyncBridge | None:
    """The bridge running the calling code, when it runs on a bridge's event loop."""
    bridge = _BRIDGE.get()
    return bridge if bridge is not None and bridge.on_loop() else None


@dataclass
class _Run:
    """What happened to one coroutine the bridge ran."""

    cancel_sent: bool = False
    finishing: bool = False


class AsyncBridge:
    """An event loop on a thread of its own for one attempt's async code, its stop watcher, and
    the attempt's thread serving the store calls the loop hands it. Use it as a context manager."""

    def __init__(self, signal: Signal, log: Log, *, job: str, slot: str):
        self.signal, self.log, self.job, self.slot = signal, log, job, slot
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"resumable-async-{job}", daemon=True)
        self._home = threading.get_ident()
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._running: dict[asyncio.Task[Any], _Run] = {}
        self._sent: dict[asyncio.Task[Any], float] = {}
        self._warned = False
        self._watcher: concurrent.futures.Future[None] | None = None

    def __enter__(self) -> AsyncBridge:
        self._thread.start()
        self._watcher = asyncio.run_coroutine_threadsafe(self._watch(), self._loop)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._watcher is not None:
            self._watcher.cancel()

        async def close() -> None:
            # Tasks the handler left running (started, never awaited) end with it.
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in left:
                task.cancel()
            if left:
                await asyncio.wait(left, timeout=2)
            await self._loop.shutdown_asyncgens()

        try:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=5)
        except Exception:  # never in place of the handler's own outcome
            self.log.debug("async generators did not close [job=%s slot=%s]", self.job, self.slot, exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    def on_loop(self) -> bool:
        return threading.get_ident() == self._thread.ident

    # -- the attempt's thread ----------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run the handler's coroutine to its end, serving store calls meanwhile (attempt's thread).

        Raises:
            Cancelled / Paused / LeaseLost: a stop source fired and cancelled the handler's await.
            Exception: whatever the handler raised.
        """
        return self._wait(coro)

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        """``await fn(*args, **kwargs)`` on the loop, from the attempt's thread (an async ``read`` or
        ``process`` called by the synchronous chunk loop)."""
        if threading.get_ident() != self._home:
            raise RuntimeError("AsyncBridge.call() is for the attempt's thread")
        result = fn(*args, **kwargs)
        if not asyncio.iscoroutine(result):
            return result  # a sync function: nothing to drive
        return self._wait(result)

    def _wait(self, coro: Coroutine[Any, Any, Any]) -> Any:
        run = _Run()
        future = asyncio.run_coroutine_threadsafe(self._guarded(coro, run), self._loop)
        future.add_done_callback(lambda _: self._calls.put(_WAKE))
        while not future.done():
            item = self._calls.get()
            if item is not _WAKE:
                item()
        try:
            result = future.result()
        except concurrent.futures.CancelledError:
            if run.cancel_sent:
                self.signal.raise_if_cancelled()  # the reason the stop source gave: Cancelled, Paused, LeaseLost
            raise RuntimeError(
                f"the async handler's task was cancelled by something other than the run's stop sources "
                f"[job={self.job} slot={self.slot}]") from None
        except BaseException:
            self._ignored(run)
            raise
        self._ignored(run)
        return result

    def _ignored(self, run: _Run) -> None:
        if run.cancel_sent and not run.finishing:
            self._warn_ignored()

    def _warn_ignored(self) -> None:
        if not self._warned:
            self._warned = True
            self.log.warning(
                "the async handler ignored a cancellation (reason: %s): it caught asyncio.CancelledError and went on; "
                "it is cancelled again every %gs and stopped at its next checkpoint. Let CancelledError propagate "
                "(or re-raise it) [job=%s slot=%s]", self.signal.reason, RECANCEL, self.job, self.slot)

    # -- the loop's thread ---------------------------------------------------------------------

    async def _guarded(self, coro: Coroutine[Any, Any, Any], run: _Run) -> Any:
        task = asyncio.current_task()
        assert task is not None
        _BRIDGE.set(self)
        self._running[task] = run
        try:
            return await coro
        finally:
            del self._running[task]
            run.cancel_sent = task in self._sent
            run.finishing = task in _FINISHING
            self._sent.pop(task, None)

    async def _watch(self) -> None:
        """Cancel every running coroutine once the signal fires; again if one ignored it."""
        while True:
            await asyncio.sleep(POLL)
            if not self.signal.cancelled:
                continue
            now = time.monotonic()
            for task in list(self._running):
                sent = self._sent.get(task)
                if sent is not None and task in _FINISHING:
                    continue  # finishing a checkpoint, then it stops
                if sent is None or now - sent >= RECANCEL:
                    if sent is not None:
                        self._warn_ignored()
                    self._sent[task] = now
                    task.cancel(f"the run was asked to stop ({self.signal.reason})")

    async def home(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the attempt's thread, awaited on the loop without blocking it.
        Not cancellable once handed over: a cancellation that arrives meanwhile waits for it, then
        goes on (a checkpoint is written whole or not at all, never abandoned half way)."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def call() -> None:
            if not done.set_running_or_notify_cancel():
                return
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                done.set_exception(exc)

        self._calls.put(call)
        waiting = asyncio.wrap_future(done)
        cancelled = False
        result = None
        while True:
            try:
                result = await asyncio.shield(waiting)
                break
            except asyncio.CancelledError:
                if not cancelled:  # finishing the call on purpose: not "ignored", not cancelled again
                    cancelled = True
                    task = asyncio.current_task()
                    if task is not None:
                        _FINISHING.add(task)
                if waiting.done():
                    break
        if cancelled:
            waiting.result()  # the call's own error first (a checkpoint stopping the run: Cancelled, Paused)
            raise asyncio.CancelledError
        return result

    def blocking(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the attempt's thread, called from the loop: blocks the loop
        until it returns (a sync ``ctx.checkpoint()`` in an async handler)."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def call() -> None:
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                done.set_exception(exc)

        self._calls.put(call)
        return done.result()


class SyncCalls:
    """The synchronous face of possibly-async functions, for the chunk loop: ``calls.sync(fn)``
    calls ``fn`` and, when it gives back a coroutine, runs it to its end on the attempt's bridge
    (started on the first coroutine; one per attempt thread, shared by nested uses). Use it as a
    context manager around the calls."""

    _local = threading.local()

    def __init__(self, signal: Signal, log: Log, *, job: str, slot: str):
        self.signal, self.log, self.job, self.slot = signal, log, job, slot
        self._bridge: AsyncBridge | None = None
        self._owner = False

    def __enter__(self) -> SyncCalls:
        outer = getattr(self._local, "calls", None)
        if outer is None:
            self._local.calls, self._owner = self, True
        else:
            self._outer = outer
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owner:
            self._local.calls = None
            if self._bridge is not None:
                self._bridge.__exit__(None, None, None)
                self._bridge = None

    def _shared(self) -> SyncCalls:
        return self if self._owner else self._outer

    def sync(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as a synchronous function (itself, for a plain function's results)."""

        def call(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            if not asyncio.iscoroutine(result):
                return result
            owner = self._shared()
            if owner._bridge is None:
                owner._bridge = AsyncBridge(self.signal, self.log, job=self.job, slot=self.slot).__enter__()
            return owner._bridge.run(result)

        return call


def drive(coro: Coroutine[Any, Any, Any], signal: Signal, log: Log, *, job: str, slot: str) -> Any:
    """Run an async handler's coroutine to its end on a bridge of its own (see the module docstring).

    Raises:
        ConfigurationError: called from inside a running event loop (the coroutine is closed).
        Cancelled / Paused / LeaseLost: a stop source fired while it ran.
        Exception: whatever the handler raised.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise ConfigurationError(
            "an async handler was started from inside a running event loop", job=job, slot=slot,
            hint="Run the attempt from synchronous code (an operator's execute, or a plain thread); it drives the "
            "handler on an event loop of its own")
    with AsyncBridge(signal, log, job=job, slot=slot) as bridge:
        return bridge.run(coro)


async def map_items(ctx: Any, items: Iterable[Any], fn: Callable[[Any], Awaitable[Any]], *, limit: int,
                    key: Callable[[Any], Any], every: int | None,
                    skip_on: tuple[type[Exception], ...] | None, skip_limit: int) -> list[Any]:
    """``ctx.map()`` (``ctx`` is the :class:`~airflow_resumable.core.attempt.context.RunContext`, which
    imports this module): run ``fn(item)`` for every item, at most ``limit`` at once, saving the
    contiguous low-water mark (see :meth:`~airflow_resumable.core.attempt.context.RunContext.map`)."""
    todo: Sequence[Any] = items if isinstance(items, Sequence) else list(items)
    count = len(todo)
    keys = [key(item) for item in todo]
    every = limit if every is None else every
    results: list[Any] = [None] * count
    finished = [False] * count
    base = ctx.processed
    mark = saved = started = 0  # todo[:mark] finished; todo[:saved] saved; todo[:started] started
    running: dict[asyncio.Future[Any], int] = {}

    async def stop_running() -> None:
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(list(running))
        running.clear()

    try:
        while mark < count:
            # The window: no item starts more than `limit` items ahead of the mark, so a crash
            # repeats at most the window (plus what finished since the last save).
            while started < count and started < mark + limit:
                running[asyncio.ensure_future(fn(todo[started]))] = started
                started += 1
            done, _ = await asyncio.wait(list(running), return_when=asyncio.FIRST_COMPLETED)
            for task in done:
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
            while mark < count and finished[mark]:
                mark += 1
            if mark - saved >= every:
                await ctx.acheckpoint(keys[mark - 1], processed=base + mark)
                saved = mark
    except asyncio.CancelledError:
        # A stop source: the items before the mark are done; keep them, then stop (the checkpoint raises).
        await stop_running()
        if mark > saved and ctx.signal.cancelled:
            current = asyncio.current_task()
            if current is not None:
                _FINISHING.add(current)
            await ctx.acheckpoint(keys[mark - 1], processed=base + mark)
        raise
    except BaseException:
        await stop_running()
        raise
    if mark > saved:
        await ctx.acheckpoint(keys[mark - 1], processed=base + mark)
    return results
