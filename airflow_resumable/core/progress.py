"""Progress: the figures reported after each durable checkpoint, and how they reach people."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from airflow_resumable.core import defaults
from airflow_resumable.core.checkpoint import Checkpoint


class Log(Protocol):
    """What the core logs through: a :class:`logging.Logger`, or Airflow's task logger."""

    def debug(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def info(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def warning(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def error(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def exception(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Progress:
    processed: int
    total: int | None
    #: items per second over this attempt
    rate: float | None
    #: seconds left at that rate, if the total is known
    eta: float | None

    @property
    def percent(self) -> float | None:
        if not self.total:
            return None
        return min(100.0, 100.0 * self.processed / self.total)

    def format(self) -> str:
        parts = []
        if self.percent is not None:
            parts.append(f"{self.percent:.0f}%")
        parts.append(f"processed={self.processed}" + (f"/{self.total}" if self.total is not None else ""))
        if self.rate is not None:
            parts.append(f"rate={self.rate:,.0f}/s")
        if self.eta is not None:
            parts.append(f"eta={_duration(self.eta)}")
        return " ".join(parts)


class Reporter:
    """Receives the run's events, always *after* the row they describe is durable.

    The default writes progress lines to a logger, at most one per ``interval`` seconds (the first
    and the last checkpoint are always logged). Subclasses add other channels (Airflow's XCom).
    """

    def __init__(self, log: Log | None = None, *, interval: float = defaults.PROGRESS_INTERVAL, clock: Callable[[], float] = time.monotonic):
        self.log: Log = log or logging.getLogger("airflow_resumable")
        self.interval = interval
        self._clock = clock
        self._last: float | None = None

    def on_start(self, cp: Checkpoint, *, resumed: bool) -> None:
        """The attempt holds the lease and its row says ``running``."""

    def due(self, processed: int, total: int | None) -> bool:
        """Whether :meth:`on_checkpoint` would report anything now (checked before building the
        row and the figures it needs, which most checkpoints of a fast loop can skip)."""
        return self._log_due(processed, total)

    def _log_due(self, processed: int, total: int | None) -> bool:
        if self._last is None or (total is not None and processed >= total):
            return True
        return self._clock() - self._last >= self.interval

    def on_checkpoint(self, cp: Checkpoint, progress: Progress) -> None:
        if self._log_due(progress.processed, progress.total):
            self._last = self._clock()
            self.log.info("progress %s [job=%s slot=%s]", progress.format(), cp.job, cp.slot)

    def on_finish(self, cp: Checkpoint) -> None:
        """The attempt ended (any status) and released its lease."""


class ProgressMeter:
    """Turns successive ``processed`` counts into a rate and an ETA for this attempt."""

    def __init__(self, processed_at_start: int, clock: Callable[[], float] = time.monotonic):
        self._start = clock()
        self._base = processed_at_start
        self._clock = clock

    def measure(self, processed: int, total: int | None) -> Progress:
        elapsed = self._clock() - self._start
        done = processed - self._base
        rate = done / elapsed if elapsed > 0 and done > 0 else None
        eta = (total - processed) / rate if rate and total is not None and total >= processed else None
        return Progress(processed=processed, total=total, rate=rate, eta=eta)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
