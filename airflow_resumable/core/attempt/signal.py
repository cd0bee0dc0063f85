"""The cancellation token every cancel source folds into.

A :class:`Signal` is raised once, with a reason; the first reason wins. Handlers read it at chunk
boundaries (``signal.cancelled``, ``signal.raise_if_cancelled()``) or sleep on it
(``signal.wait(seconds)``).

``cancel()`` is safe to call from a POSIX signal handler running on the main thread (Airflow calls
``on_kill`` from its SIGTERM handler): on the main thread it only assigns attributes and takes no
lock, so it cannot deadlock against the code it interrupted. From any other thread it also wakes
``wait()``. On every thread it calls the functions given to :meth:`Signal.on_cancel` (an async
handler's watcher wakes so).

A stop request a person left on the slot's row (a pause, a cancel) reaches the holder as this signal:
:func:`raise_request`, called by whichever reads it first, the checkpoint's own statement or a heartbeat.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_resumable.core.model.errors import Cancelled, LeaseLost, Paused
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.model.states import AttemptEnd, Reason

#: How often ``wait()`` re-reads the flag when woken by nothing (a cancel from the main thread,
#: or a signal handler, does not wake the event).
_POLL = 0.05


class Signal:
    """One cancellation token with a reason, and an optional deadline (the cooperative timeout)."""

    def __init__(self, *, deadline: float | None = None, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._deadline = deadline
        self._reason: str | None = None
        self._message: str | None = None
        self._event = threading.Event()
        #: Called once the signal is raised (replaced whole, never changed in place: no lock).
        self._listeners: tuple[Callable[[], None], ...] = ()

    @property
    def deadline(self) -> float | None:
        """The monotonic time at which the signal fires with reason ``timeout``, if any."""
        return self._deadline

    def time_left(self) -> float | None:
        """Seconds until the deadline by the signal's clock (0 or less: passed), or None without one."""
        return None if self._deadline is None else self._deadline - self._clock()

    def fire_after(self, seconds: float) -> None:
        """Start the timeout: the signal fires with reason ``timeout`` ``seconds`` from now."""
        self._deadline = self._clock() + seconds

    def cancel(self, reason: str | Reason, message: str | None = None) -> bool:
        """Raise the signal. Returns False if it had already been raised (the first reason wins)."""
        if self._reason is not None:
            return False
        self._message = message
        self._reason = str(reason)
        if threading.current_thread() is not threading.main_thread():
            self._event.set()
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # noqa: S110 - a listener only wakes someone who reads the signal anyway
                pass
        return True

    def on_cancel(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` when the signal is raised (at once when it is already), in the thread
        that raises it: that may be a POSIX signal handler on the main thread, so the listener must
        take no lock (``loop.call_soon_threadsafe(...)`` takes none). Returns the function that
        removes it. The timeout's deadline raises the signal when someone reads it: a listener that
        must know the moment sleeps until :attr:`deadline` itself."""
        self._listeners = (*self._listeners, listener)

        def remove() -> None:
            self._listeners = tuple(f for f in self._listeners if f is not listener)

        if self._reason is not None:
            listener()
        return remove

    def _check_deadline(self) -> None:
        if self._reason is None and self._deadline is not None and self._clock() >= self._deadline:
            self.cancel(Reason.TIMEOUT, "the run's timeout passed")

    @property
    def cancelled(self) -> bool:
        """True once any source raised the signal (or the deadline passed)."""
        self._check_deadline()
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        """Why the signal was raised, or None while it was not."""
        self._check_deadline()
        return self._reason

    @property
    def message(self) -> str | None:
        """A human-readable sentence about the cancel, if the source gave one."""
        self._check_deadline()
        return self._message

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~airflow_resumable.core.model.errors.Cancelled` if the signal was raised.

        Raises:
            LeaseLost: the reason is ``lease_lost``: another attempt owns the slot (the one
                representation of a lost lease that handlers see).
            Paused: the reason is ``paused`` (a kind of Cancelled: handlers stop the same way).
            Cancelled: carrying any other reason.
        """
        if self.cancelled:
            if self._reason == Reason.LEASE_LOST:
                raise LeaseLost(self._message or "the slot's lease is no longer this attempt's")
            if self._reason == Reason.PAUSED:
                raise Paused(Reason.PAUSED.value, self._message)
            raise Cancelled(self._reason or "", self._message)

    def classify(self, reason: str, message: str | None = None) -> None:
        """Replace a raised ``terminated`` with what it turned out to mean (``user`` or
        ``shutdown``), so the signal and the row say the same."""
        if self._reason == Reason.TERMINATED:
            self._reason, self._message = str(reason), message

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking early when the signal is raised. Returns ``cancelled``."""
        end = self._clock() + max(0.0, seconds)
        while not self.cancelled:
            remaining = end - self._clock()
            if remaining <= 0:
                return False
            if self._deadline is not None:
                remaining = min(remaining, max(0.0, self._deadline - self._clock()))
            self._event.wait(min(remaining, _POLL))
        return True

    async def wait_async(self, seconds: float | None = None) -> bool:
        """:meth:`wait` for async code, without blocking the event loop: ``await
        ctx.signal.wait_async()`` returns once the signal is raised (or after ``seconds``, if
        given). Returns ``cancelled``. Race it against I/O to abort the I/O when the run stops
        (an async handler's pending await is cancelled on a stop anyway). It sleeps until the
        signal wakes it, its own time is up or the run's deadline comes: no polling."""
        import asyncio

        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:  # from any thread, or a POSIX signal handler: takes no lock
            try:
                loop.call_soon_threadsafe(woken.set)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

        remove = self.on_cancel(wake)
        try:
            end = None if seconds is None else self._clock() + max(0.0, seconds)
            while not self.cancelled:
                left = None if end is None else end - self._clock()
                if left is not None and left <= 0:
                    return False
                until_deadline = self.time_left()
                sleep = min((t for t in (left, until_deadline) if t is not None), default=None)
                try:
                    async with asyncio.timeout(None if sleep is None else max(0.0, sleep)):
                        await woken.wait()
                except TimeoutError:
                    pass
            return True
        finally:
            remove()

    def __repr__(self) -> str:
        return f"Signal(cancelled={self.cancelled}, reason={self._reason!r})"


# -- a stop request read off the slot's row ------------------------------------------------------


#: The stop requests a person makes, by the reason the holder reads, and their history's outcome.
_ASKED = {Reason.PAUSED.value: ("pause", AttemptEnd.PAUSE_REQUESTED),
          Reason.REQUESTED.value: ("cancel", AttemptEnd.CANCEL_REQUESTED)}


def request_message(reason: str, by: str | None) -> str:
    """How a stop request reads on the row (``last_error``) and in the log: ``cancel requested by
    alice``, naming who asked (the UI's user, the CLI's ``--by``); a request whose author is unknown
    names the ways one is made."""
    if reason == Reason.HANDOVER.value:
        return ("a newer try of this task instance waits for the slot (Airflow gave the task instance to it): "
                "handing the slot over with the checkpoint")
    if reason not in _ASKED:
        return f"{reason}: requested through the checkpoint row"
    what = _ASKED[reason][0]
    return f"{what} requested by {by}" if by else f"{what} requested through the control API (CLI, UI or REST)"


def raise_request(signal: Signal, session: Any, fence: Fence, request: str) -> bool:
    """Raise the run's ``signal`` for a stop ``request`` read off the slot's row (by a heartbeat or
    by a checkpoint's own statement: whichever comes first), with the message that names who asked
    (one read on ``session``, only now). Returns False when the signal was raised already."""
    if signal.cancelled:
        return False
    if request == Reason.LEASE_LOST.value:  # only a run gives it; on the row it was written by hand or a program
        # The write that read it proved the lease is this attempt's: a cancel, not a lost lease (which
        # would stop without writing anything, and leave the row running under a lease nobody renews).
        return signal.cancel(Reason.REQUESTED.value, "cancelled: the checkpoint row asked to stop with the reason "
                             "'lease_lost', which only a run gives itself (the row was edited by hand or by a "
                             "program); this attempt still held the lease")
    return signal.cancel(request, request_message(request, _who_asked(session, fence, request)))


def _who_asked(session: Any, fence: Fence, reason: str) -> str | None:
    """Who made the stop request, from the slot's history: one read, only when a request arrives.
    None when unknown (a request a program wrote on the row, no session to read with, or the read
    failed)."""
    if reason not in _ASKED or session is None:
        return None
    try:
        return session.requests.requested_by(fence.job, fence.slot, _ASKED[reason][1])
    except Exception:  # who asked is a courtesy: the stop itself must not wait on it
        return None

