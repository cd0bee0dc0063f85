"""Waiting on a condition with a deadline: the one helper the tests poll with (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str = "the condition", timeout: float = 30.0,
               interval: float = 0.01) -> T:
    """Call ``condition`` until it returns something truthy, and return that. Fails (an
    ``AssertionError`` naming ``what``) once ``timeout`` seconds passed without it."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"gave up after {timeout:g}s waiting for {what}"
        time.sleep(interval)
