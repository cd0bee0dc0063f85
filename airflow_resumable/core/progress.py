"""Progress: the figures reported after each durable checkpoint, and how they reach people."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from airflow_resumable.core import defaults
from airflow_resumable.core.checkpoint import Checkpoint, Status


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
    #: how long the save of the checkpoint being reported took (seconds), when measured
    save_seconds: float | None = None

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
    and the last checkpoint are always logged), and a last line when the run is done. Only the
    attempt's first line names the job and the slot (the log is the attempt's: the others would
    repeat it, and long lines scroll sideways in the UI's log view). Subclasses add other channels
    (Airflow's XCom and metrics).
    """

    def __init__(self, log: Log | None = None, *, interval: float = defaults.PROGRESS_INTERVAL, clock: Callable[[], float] = time.monotonic):
        self.log: Log = log or logging.getLogger("airflow_resumable")
        self.interval = interval
        self._clock = clock
        self._last: float | None = None
        self._began = clock()

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
            first = self._last is None
            self._last = self._clock()
            if first:
                self.log.info("progress %s [job=%s slot=%s]", progress.format(), cp.job, cp.slot)
            else:
                self.log.info("progress %s", progress.format())

    def on_finish(self, cp: Checkpoint) -> None:
        """The attempt ended (any status) and released its lease. A ``done`` run gets a last line."""
        if cp.status == Status.DONE:
            self.log.info("done: processed=%s%s in %s [job=%s slot=%s]", cp.processed,
                          f"/{cp.total}" if cp.total is not None else "", _duration(self._clock() - self._began),
                          cp.job, cp.slot)


class ProgressMeter:
    """Turns successive ``processed`` counts into a rate and an ETA for this attempt.

    The rate is measured from the attempt's first reported checkpoint on, not from its start: the
    first report has none (nothing measured yet, where one fast first chunk would promise a wild
    rate and an ETA of 0 s), and every later one spans whole chunk cycles, the handler's waits
    between chunks included, so the ETA counts them too.
    """

    def __init__(self, processed_at_start: int, clock: Callable[[], float] = time.monotonic):
        self._start: float | None = None
        self._base = processed_at_start
        self._clock = clock

    def measure(self, processed: int, total: int | None, *, save_seconds: float | None = None) -> Progress:
        now = self._clock()
        if self._start is None:
            self._start, self._base = now, processed
            return Progress(processed=processed, total=total, rate=None, eta=None, save_seconds=save_seconds)
        elapsed = now - self._start
        done = processed - self._base
        rate = done / elapsed if elapsed > 0 and done > 0 else None
        eta = (total - processed) / rate if rate and total is not None and total >= processed else None
        return Progress(processed=processed, total=total, rate=rate, eta=eta, save_seconds=save_seconds)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
