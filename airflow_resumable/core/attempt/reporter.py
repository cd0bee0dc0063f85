"""Progress: the figures reported after each durable checkpoint, and how they reach people."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from airflow_resumable.core.model import defaults
from airflow_resumable.core.model.checkpoint import Checkpoint, Status
from airflow_resumable.core.view import eta_of, percent_of


class Log(Protocol):
    """What the core logs through: a :class:`logging.Logger`, or Airflow's task logger."""

    def debug(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def info(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def warning(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def error(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def exception(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...


#: The rate is measured over this many recent chunk cycles (checkpoint to checkpoint) at most.
WINDOW = 10
#: No rate (and so no ETA) until the window spans this many chunk cycles and this many seconds:
#: one fast first chunk would promise a wild rate and an ETA of 0 s.
MIN_CHUNKS, MIN_SECONDS = 2, 1.0


class RateWindow:
    """The one rate-and-ETA computation, over a window of an attempt's recent checkpoints.

    The attempt feeds it at every checkpoint (:class:`ProgressMeter`) and writes its rate on the
    row with the checkpoint (column ``rate``): the task's log and XCom, and every reader of the
    row (``core/view.py``: the tab, the jobs page, REST, the CLI) show that one number, and the
    ETA from it (:func:`~airflow_resumable.core.view.eta_of`). A sample is a checkpoint: when it was
    durable and how many items were processed then. The rate spans whole chunk cycles, the
    handler's waits between chunks included, so the ETA counts them too; it starts at the first
    checkpoint seen, not at the attempt's start (the first chunk has no wait before it). A window
    belongs to one attempt (one lease): a pause, a deferral or a retry starts a new one, so paused
    and deferred time is never measured.
    """

    def __init__(self, size: int = WINDOW):
        self._samples: deque[tuple[float, int]] = deque(maxlen=size + 1)

    def add(self, at: float, processed: int) -> None:
        """A checkpoint durable at ``at`` (seconds, any clock) with ``processed`` items done.

        The same checkpoint seen again (or a heartbeat's later look at it) adds nothing; fewer
        items than before (a restart) start the window over.
        """
        if self._samples:
            last_at, last = self._samples[-1]
            if processed < last:
                self._samples.clear()
            elif processed == last or at <= last_at:
                return
        self._samples.append((at, processed))

    def rate(self) -> float | None:
        """Items per second over the window, or None until it measured enough."""
        if len(self._samples) < MIN_CHUNKS + 1:
            return None
        (first_at, first), (last_at, last) = self._samples[0], self._samples[-1]
        span = last_at - first_at
        if span < MIN_SECONDS or last <= first:
            return None
        return (last - first) / span

    def estimate(self, total: int | None, *, now: float | None = None) -> tuple[float | None, float | None]:
        """``(rate, eta)``: the rate, and the seconds left at it when the total is known.

        ``now`` (on the samples' clock) counts the time since the last checkpoint as spent:
        a look between two checkpoints sees the ETA count down, not stand still.
        """
        rate = self.rate()
        if rate is None:
            return None, None
        at, processed = self._samples[-1]
        return rate, eta_of(rate, processed, total, since=0.0 if now is None else now - at)


@dataclasses.dataclass(frozen=True)
class Progress:
    processed: int
    total: int | None
    #: items per second over the attempt's recent chunks (:class:`RateWindow`)
    rate: float | None
    #: seconds left at that rate, if the total is known
    eta: float | None
    #: how long the save of the checkpoint being reported took (seconds), when measured
    save_seconds: float | None = None

    @property
    def percent(self) -> float | None:
        return percent_of(self.processed, self.total)

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
    """Turns successive ``processed`` counts of this attempt into a rate and an ETA: a
    :class:`RateWindow` on the attempt's clock. Nothing is measured before two chunk cycles and a
    second have passed (the first reports have no rate and no ETA)."""

    def __init__(self, processed_at_start: int, clock: Callable[[], float] = time.monotonic):
        self._window = RateWindow()
        self._clock = clock

    def observe(self, processed: int) -> float | None:
        """A chunk ended with ``processed`` items done: its sample, and the rate the checkpoint
        stores on the row (the one every face reads; None until measured)."""
        self._window.add(self._clock(), processed)
        return self._window.rate()

    def measure(self, processed: int, total: int | None, *, save_seconds: float | None = None) -> Progress:
        self._window.add(self._clock(), processed)
        rate, eta = self._window.estimate(total)
        return Progress(processed=processed, total=total, rate=rate, eta=eta, save_seconds=save_seconds)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
