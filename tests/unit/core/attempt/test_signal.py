"""The signal, without Airflow: the first reason wins, a wait wakes on a cancel, the deadline fires
as a timeout.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from airflow_resumable.core import Cancelled, Signal


def test_the_first_reason_wins() -> None:
    sig = Signal()
    assert sig.cancel("user") and not sig.cancel("timeout")
    assert sig.reason == "user"
    with pytest.raises(Cancelled) as err:
        sig.raise_if_cancelled()
    assert err.value.reason == "user"


def test_wait_wakes_when_another_thread_cancels() -> None:
    sig = Signal()
    threading.Timer(0.05, sig.cancel, args=("shutdown",)).start()
    assert sig.wait(30) is True and sig.reason == "shutdown"


def test_the_deadline_fires_as_timeout() -> None:
    now = [100.0]
    sig = Signal(deadline=105.0, clock=lambda: now[0])
    assert not sig.cancelled
    now[0] = 105.0
    assert sig.cancelled and sig.reason == "timeout"


class CountingSignal(Signal):
    """A signal counting how often it is looked at (each look checks the deadline)."""

    looks = 0

    def _check_deadline(self) -> None:
        self.looks += 1
        super()._check_deadline()


def test_wait_async_sleeps_until_another_thread_cancels_without_polling() -> None:
    # Given an async wait with no end, and a thread that lets it sleep half a second, then cancels
    sig = CountingSignal()
    quiet: list[int] = []

    def stop_later() -> None:
        before = sig.looks
        time.sleep(0.5)  # the quiet stretch whose looks are counted
        quiet.append(sig.looks - before)
        sig.cancel("shutdown")

    async def main() -> bool:
        threading.Thread(target=stop_later).start()
        return await asyncio.wait_for(sig.wait_async(), 30)

    # When it runs, Then it woke with the cancel, having looked at the signal at most once while
    # nothing happened (a 50 ms poll looks about 10 times in that half second)
    assert asyncio.run(main()) is True and sig.reason == "shutdown"
    assert quiet[0] <= 1, f"the wait looked at the signal {quiet[0]} times in a quiet half second"


def test_wait_async_returns_at_its_own_end_or_at_the_run_s_deadline() -> None:
    # Given a wait of 0.1 s on a signal with no deadline, and one of 60 s on a signal whose deadline is 0.1 s away
    plain = Signal()
    timed = Signal(deadline=time.monotonic() + 0.1)

    async def main() -> tuple[bool, bool]:
        return await plain.wait_async(0.1), await asyncio.wait_for(timed.wait_async(60), 30)

    # Then the first ends uncancelled, the second with the timeout
    assert asyncio.run(main()) == (False, True)
    assert not plain.cancelled and timed.reason == "timeout"


def test_wait_async_returns_at_once_on_a_raised_signal_and_leaves_no_listener() -> None:
    sig = Signal()
    sig.cancel("user")
    assert asyncio.run(sig.wait_async(60)) is True
    assert sig._listeners == ()
