"""The signal, without Airflow: the first reason wins, a wait wakes on a cancel, the deadline fires
as a timeout.
"""

from __future__ import annotations

import threading

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
