"""Async handlers: ``async def`` handlers and chunk functions, driven by an event loop of the attempt's own.

The attempt calls a handler as it calls any; when the call gives back a coroutine, an
:class:`AsyncBridge` runs it. The bridge keeps two threads apart:

- the **event loop** runs on a thread of its own, with the handler's coroutine and a watcher;
- the **attempt's thread** (the one that opened the checkpoint database's connection, which a
  SQLite connection requires) waits for the handler and meanwhile runs the store calls the loop
  hands it: ``await ctx.acheckpoint(...)`` and ``await ctx.arun(fn)``. A checkpoint's write never
  runs on the loop, so the loop is never blocked by it. The handler's own threads
  (``asyncio.to_thread``, an executor) hand their ``ctx.checkpoint()`` to it the same way
  (:func:`serving`).

The watcher sleeps until something happens: the signal raised (by any thread, or a POSIX signal
handler: :meth:`~airflow_resumable.core.attempt.signal.Signal.on_cancel` wakes it), the timeout's deadline,
a coroutine started after the signal fired, or a re-cancel due. Once any stop source raised the
signal (timeout, a cancel or pause request, SIGTERM, a lost lease), it cancels the handler's task: the
pending ``await`` raises ``asyncio.CancelledError`` at once, and the attempt ends as a sync handler
stopped at a checkpoint does (:class:`~airflow_resumable.core.model.errors.Cancelled`, ``Paused`` or
``LeaseLost``, the reason on the row). A handler that catches the cancellation and goes on is
cancelled again every :data:`RECANCEL` seconds, the log says it ignored one, and its next
checkpoint stops it; after :data:`ABANDON_AFTER` ignored in a row the attempt stops without it.
Async code that returns after a stop's cancellation ends with the stop (never ``done``), and code
that returns while tasks it started still run fails (their work is cut, not done).

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
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from airflow_resumable.core.attempt.reporter import Log
from airflow_resumable.core.attempt.signal import Signal
from airflow_resumable.core.model.errors import AttemptEnded, ConfigurationError
from airflow_resumable.core.model.outward import outward_traceback

#: The watcher's longest sleep while the run has a timeout: a signal with a clock of its own (a
#: test's) is read at least this often. With the default clock it wakes at the deadline itself.
DEADLINE_CHECK = 1.0
#: How long a handler may ignore a cancellation before it is cancelled again (and the log says so).
RECANCEL = 1.0
#: How many cancellations in a row a handler may ignore, one every :data:`RECANCEL` seconds, before
#: the attempt stops without it: its coroutine is left on the loop, which stops with the attempt.
ABANDON_AFTER = 10

#: The bridge whose loop runs the current task (set in every task the bridge starts).
_BRIDGE: contextvars.ContextVar[AsyncBridge | None] = contextvars.ContextVar("resumable_bridge", default=None)
#: Tasks finishing a checkpoint (or another call on the attempt's thread) in flight: not cancelled
#: again until it is written. Each leaves the set once its call ended.
_FINISHING: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
#: Tasks whose cancellation was taken in by a call they finished (it raised the stop, or
#: CancelledError, after the call): what they do next is not "ignoring" that cancellation.
_CONSUMED: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
#: What the attempt's thread takes off its queue to look at its future again.
_WAKE = object()
#: The bridge whose attempt thread (by its ident) is serving store calls now (waiting for async code).
_SERVING: dict[int, AsyncBridge] = {}


def current_bridge() -> AsyncBridge | None:
    """The bridge running the calling code, when it runs on a bridge's event loop."""
    bridge = _BRIDGE.get()
    return bridge if bridge is not None and bridge.on_loop() else None


def serving(thread: int) -> AsyncBridge | None:
    """The bridge whose attempt thread is ``thread``, while that thread waits for async code and
    runs the store calls handed to it (from the loop, or from any other thread); else None."""
    return _SERVING.get(thread)


class _Call:
    """A store call handed to the attempt's thread, and its outcome."""

    __slots__ = ("args", "done", "fn", "kwargs")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.done: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def __call__(self) -> None:
        if not self.done.set_running_or_notify_cancel():
            return
        try:
            self.done.set_result(self.fn(*self.args, **self.kwargs))
        except BaseException as exc:
            self.done.set_exception(exc)


@dataclass
class _Run:
    """What happened to one coroutine the bridge ran."""

    cancel_sent: bool = False
    finishing: bool = False
    #: The cancellations it was sent (the first one and those it ignored).
    sent: int = 0
    #: It ignored :data:`ABANDON_AFTER` of them: the attempt stopped without waiting for it any longer.
    abandoned: bool = False
    #: Tasks the coroutine started that were still pending when it returned (cancelled since).
    left: tuple[str, ...] = ()


class AsyncBridge:
    """An event loop on a thread of its own for one attempt's async code, its stop watcher, and
    the attempt's thread serving the store calls the loop hands it. Use it as a context manager."""

    def __init__(self, signal: Signal, log: Log, *, job: str, slot: str):
        self.signal, self.log, self.job, self.slot = signal, log, job, slot
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"resumable-async-{job}", daemon=True)
        self._home = threading.get_ident()
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._guard = threading.Lock()  # calls are handed over only while the attempt's thread serves them
        self._serving = 0
        self._running: dict[asyncio.Task[Any], _Run] = {}
        self._sent: dict[asyncio.Task[Any], float] = {}
        self._warned = False
        self._watcher: concurrent.futures.Future[None] | None = None
        self._woken: asyncio.Event | None = None  # made on the loop, by the watcher
        self._watch_task: asyncio.Task[Any] | None = None
        self._unlisten: Callable[[], None] | None = None

    def __enter__(self) -> AsyncBridge:
        self._thread.start()
        self._watcher = asyncio.run_coroutine_threadsafe(self._watch(), self._loop)
        self._unlisten = self.signal.on_cancel(self._wake_threadsafe)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._unlisten is not None:
            self._unlisten()
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
        except Exception as exc:  # never in place of the handler's own outcome
            self.log.debug("async generators did not close [job=%s slot=%s]\n%s", self.job, self.slot,
                           outward_traceback(exc))
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
        with self._guard:
            self._serving += 1
            _SERVING[self._home] = self
        try:
            future = asyncio.run_coroutine_threadsafe(self._guarded(coro, run), self._loop)
            future.add_done_callback(lambda _: self._calls.put(_WAKE))
            while not future.done() and not run.abandoned:
                item = self._calls.get()
                if item is not _WAKE:
                    item()
        finally:
            self._stop_serving()
        if run.abandoned and not future.done():
            self.log.error(
                "the async handler ignored %d cancellations in a row (reason: %s), %gs apart: the attempt stops "
                "without waiting for it; what it was awaiting is left unfinished on a loop that stops with the "
                "attempt. Let CancelledError propagate [job=%s slot=%s]", run.sent, self.signal.reason, RECANCEL,
                self.job, self.slot)
            self.signal.raise_if_cancelled()
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
        if run.cancel_sent:
            # It caught the stop's CancelledError and returned: whatever the cut await was doing is
            # not done, so the attempt does not end "done" (nor does the chunk loop save past the
            # chunk); it stops as a checkpoint would, and the retry resumes from the last one.
            self.signal.raise_if_cancelled()
        if run.left:
            raise ConfigurationError(
                f"the async code returned while tasks it started were still running ({', '.join(run.left)}); "
                "they were cancelled, so their work is not done and nothing after it was recorded as done",
                job=self.job, slot=self.slot,
                hint="Await every task you start before returning (await asyncio.gather(*tasks), or an "
                "asyncio.TaskGroup); for many items at once use await ctx.map(items, fn, limit=...)")
        return result

    def _stop_serving(self) -> None:
        """No more calls are handed over; those handed over meanwhile (by a thread the handler left
        running) are refused, never left waiting."""
        with self._guard:
            self._serving -= 1
            if self._serving:
                return
            _SERVING.pop(self._home, None)
            left = []
            while not self._calls.empty():
                left.append(self._calls.get_nowait())
        for item in left:
            if isinstance(item, _Call) and item.done.set_running_or_notify_cancel():
                item.done.set_exception(self._ended(getattr(item.fn, "__name__", "a store call")))

    def _ended(self, call: str) -> AttemptEnded:
        return AttemptEnded(
            f"{call} was handed to the attempt's thread after the async handler returned; nothing was written",
            job=self.job, slot=self.slot,
            hint="Await (or join) every task and thread that uses ctx before the handler returns")

    def _hand(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        """Queue ``fn(*args, **kwargs)`` for the attempt's thread.

        Raises:
            AttemptEnded: the attempt's thread no longer serves calls (the handler returned).
        """
        call = _Call(fn, args, kwargs)
        with self._guard:
            if not self._serving:
                raise self._ended(getattr(fn, "__name__", "a store call"))
            self._calls.put(call)
        return call

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
        before = asyncio.all_tasks()
        if self.signal.cancelled:  # started after the stop: the watcher cancels it too
            self._wake()
        try:
            result = await coro
            await self._left_behind(before, run)
            return result
        finally:
            del self._running[task]
            run.cancel_sent = task in self._sent
            run.finishing = task in _CONSUMED
            self._sent.pop(task, None)

    async def _left_behind(self, before: set[asyncio.Task[Any]], run: _Run) -> None:
        """Cancel the tasks the coroutine started and left running (their work would be counted
        done with it), naming them in ``run.left``."""
        if len(self._running) > 1:
            return  # another coroutine runs at once (a nested call): their tasks are told apart at the outer's end
        mine = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() - before
                if t is not mine and t is not self._watch_task and t not in self._running and not t.done()]
        if not left:
            return
        run.left = tuple(sorted({getattr(t.get_coro(), "__qualname__", t.get_name()) for t in left}))
        for t in left:
            t.cancel("the async code that started this task returned without awaiting it")
        await asyncio.wait(left, timeout=RECANCEL)

    def _wake_threadsafe(self) -> None:
        """Wake the watcher, from any thread or a POSIX signal handler (no lock taken)."""
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closed: nothing left to cancel
            pass

    def _wake(self) -> None:
        if self._woken is not None:
            self._woken.set()

    def _next_wake(self) -> float | None:
        """How long the watcher may sleep when nothing wakes it (None: until woken)."""
        if self.signal.cancelled:
            return RECANCEL if self._running else None
        left = self.signal.time_left()
        return None if left is None else min(max(0.0, left), DEADLINE_CHECK)

    async def _watch(self) -> None:
        """Cancel every running coroutine once the signal fires; again if one ignored it. Between
        two looks it sleeps until woken (see the module docstring), never polling."""
        self._woken = woken = asyncio.Event()
        self._watch_task = asyncio.current_task()
        while True:
            if self.signal.cancelled:
                self._cancel_running()
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for wraps the wait in a task of
                # its own, which the handler's left-behind check would then see as the handler's.
                async with asyncio.timeout(self._next_wake()):
                    await woken.wait()
            except TimeoutError:
                pass
            woken.clear()

    def _cancel_running(self) -> None:
        now = time.monotonic()
        for task in list(self._running):
            sent = self._sent.get(task)
            if sent is not None and task in _FINISHING:
                continue  # finishing a checkpoint, then it stops
            if sent is None or now - sent >= RECANCEL:
                run = self._running[task]
                if sent is not None:
                    self._warn_ignored()
                    if run.sent >= ABANDON_AFTER:
                        if not run.abandoned:
                            run.abandoned = True  # the attempt's thread stops waiting for it
                            self._calls.put(_WAKE)
                        continue
                run.sent += 1
                self._sent[task] = now
                task.cancel(f"the run was asked to stop ({self.signal.reason})")

    async def home(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the attempt's thread, awaited on the loop without blocking it.
        Not cancellable once handed over: a cancellation that arrives meanwhile waits for it, then
        goes on (a checkpoint is written whole or not at all, never abandoned half way)."""
        waiting = asyncio.wrap_future(self._hand(fn, args, kwargs).done)
        cancelled = False
        result = None
        task = asyncio.current_task()
        try:
            while True:
                try:
                    result = await asyncio.shield(waiting)
                    break
                except asyncio.CancelledError:
                    if not cancelled and task is not None:  # finishing the call on purpose: not cancelled again
                        hold_cancels(task)  # nor "ignored", when the error it raises then is let through
                    cancelled = True
                    if waiting.done():
                        break
        finally:
            if cancelled and task is not None:
                self.finished_call(task)
        if cancelled:
            waiting.result()  # the call's own error first (a checkpoint stopping the run: Cancelled, Paused)
            raise asyncio.CancelledError
        return result

    def finished_call(self, task: asyncio.Task[Any]) -> None:
        """``task`` finished the call it was finishing when cancelled: from now on, a cancellation it
        ignores is sent again after :data:`RECANCEL` seconds, as to any task."""
        _FINISHING.discard(task)
        if task in self._sent:
            self._sent[task] = time.monotonic()

    def blocking(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the attempt's thread, called from the loop (which it blocks
        until it returns: a sync ``ctx.checkpoint()`` in an async handler) or from another thread
        of the handler's (one of :func:`serving`'s callers).

        Raises:
            AttemptEnded: the attempt's thread no longer serves calls (the handler returned).
        """
        return self._hand(fn, args, kwargs).done.result()


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


def hold_cancels(task: asyncio.Task[Any]) -> None:
    """``task`` was cancelled by a stop and finishes a checkpoint on purpose: not cancelled again while
    it saves, and the checkpoint's ``Cancelled`` counts as this cancellation's (not one it ignored)."""
    _FINISHING.add(task)
    _CONSUMED.add(task)


def release_cancels(task: asyncio.Task[Any]) -> None:
    """``task`` finished what :func:`hold_cancels` let it finish."""
    bridge = current_bridge()
    if bridge is not None:
        bridge.finished_call(task)
    else:
        _FINISHING.discard(task)
