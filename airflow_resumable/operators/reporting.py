"""Reporting a task's progress to Airflow: the task log, XCom (key ``checkpoint``) and metrics."""

from __future__ import annotations

import time
from typing import Any

from airflow_resumable.core.attempt.reporter import Progress, Reporter
from airflow_resumable.core.model.checkpoint import Checkpoint
from airflow_resumable.core.model.outward import outward_text, outward_traceback
from airflow_resumable.core.view import ROW_LIMIT, xcom_row
from airflow_resumable.metrics import Metrics
from airflow_resumable.operators.state_store import StateStoreMirror
from airflow_resumable.operators.tracing import AttemptTrace

#: XCom key under which the checkpoint row is pushed.
XCOM_KEY = "checkpoint"

#: The largest checkpoint row pushed to XCom whole, in bytes of JSON. XCom lives in Airflow's
#: metadata database and the UI shows it; a larger row goes with its position and state cut to a
#: preview (the row in the checkpoint table stays whole). The REST listing caps rows by the same rule.
XCOM_ROW_LIMIT = ROW_LIMIT

#: After a push fails (Airflow's API server unreachable: the supervisor retries each push for about
#: 20 s, on the task's main thread), the checkpoints' pushes pause for this long, doubling with each
#: further failure up to :data:`XCOM_BACKOFF_MAX`: a task cut off from Airflow goes on working and
#: checkpointing instead of spending most of its time in pushes that fail. The end is pushed always.
XCOM_BACKOFF = 30.0
XCOM_BACKOFF_MAX = 300.0


class AirflowReporter(Reporter):
    """Logs progress and pushes the checkpoint row to XCom (key ``checkpoint``), throttled: every
    ``xcom_interval`` seconds from the attempt's start (at a checkpoint), and at its end.

    Runs on the task's main thread only, after the row is durable.
    """

    def __init__(
        self, log: Any, ti: Any, *, interval: float, xcom_interval: float, where: str = "the checkpoint store",
        metrics: Metrics | None = None, mirror: StateStoreMirror | None = None, trace: AttemptTrace | None = None,
    ):
        super().__init__(log, interval=interval)
        #: Airflow's task state store, written at the XCom push's pace.
        self.mirror = mirror
        #: The attempt's OpenTelemetry span (operators/tracing.py), fed at the reporter's pace.
        self.trace = trace
        self.ti = ti
        self.metrics = metrics or Metrics(dag_id=getattr(ti, "dag_id", None), task_id=getattr(ti, "task_id", None))
        self.xcom_interval = xcom_interval
        #: Where the whole row is, for the log line that says the XCom copy is cut.
        self.where = where
        self._last_push: float | None = None
        self._cut_logged = False
        #: Pushes that failed in a row, and until when the checkpoints' pushes pause after them.
        self._failed = 0
        self._paused_until = 0.0

    def push(self, cp: Checkpoint, progress: Progress | None = None) -> None:
        self._last_push = time.monotonic()
        try:
            self.ti.xcom_push(key=XCOM_KEY, value=self.xcom_row(cp, progress))
        except Exception as failed:  # XCom is a report channel; never fail the work over it
            self._failed += 1
            pause = min(XCOM_BACKOFF_MAX, max(XCOM_BACKOFF, self.xcom_interval) * 2 ** (self._failed - 1))
            self._paused_until = time.monotonic() + pause
            self.log.warning("could not push the checkpoint row to XCom (%s failure(s) in a row); the checkpoints go "
                             "on, their pushes pause for %.0fs [job=%s slot=%s]: %s", self._failed, pause,
                             outward_text(cp.job), outward_text(cp.slot), outward_traceback(failed))
            return  # the task state store goes through the same channel: it waits for the next push
        self._failed = 0
        if self.mirror is not None:
            self.mirror.write(cp)

    def xcom_row(self, cp: Checkpoint, progress: Progress | None = None) -> dict[str, Any]:
        """The row as pushed to XCom (:func:`airflow_resumable.core.view.xcom_row`: whole up to
        :data:`XCOM_ROW_LIMIT` bytes of JSON, else its large position/state cut to a preview marked
        ``xcom_truncated``); with ``progress``, its ``rate`` and ``eta_seconds`` too. The first cut of an
        attempt is logged, saying where the whole row is."""
        row, size, cut = xcom_row(cp, rate=None if progress is None else progress.rate,
                                  eta=None if progress is None else progress.eta, measured=progress is not None)
        if cut and not self._cut_logged:
            self._cut_logged = True
            self.log.warning(
                "the checkpoint row is %s bytes as JSON, over the %s KiB XCom limit: XCom key %r carries %s "
                "as a short preview; the whole row is in the resumable_checkpoints table of %s [job=%s slot=%s]",
                f"{size:,}", XCOM_ROW_LIMIT // 1024, XCOM_KEY,
                ", ".join(f"{name} ({n:,} bytes)" for name, n in cut.items()), self.where, cp.job, cp.slot,
            )
        return row

    def on_start(self, cp: Checkpoint, *, resumed: bool) -> None:
        # Not pushed yet: the first push comes with the first checkpoint ``xcom_interval`` seconds in,
        # or at the end. A push and a task-state-store write each cost a round trip through the
        # supervisor to the API server (17-33 ms measured, bench row 7): a short task pays them once,
        # and the row the attempt started from is in the Checkpoint tab and the table meanwhile.
        self.metrics.started(cp)
        if self.trace is not None:
            self.trace.acquired(cp, resumed=resumed)
        self._last_push = time.monotonic()

    def _xcom_due(self) -> bool:
        now = time.monotonic()
        return now >= self._paused_until and (self._last_push is None or now - self._last_push >= self.xcom_interval)

    def due(self, processed: int, total: int | None) -> bool:
        return self._xcom_due() or super().due(processed, total)

    def on_checkpoint(self, cp: Checkpoint, progress: Progress) -> None:
        super().on_checkpoint(cp, progress)
        self.metrics.checkpoint(progress.processed, progress.save_seconds)
        if self.trace is not None:
            self.trace.checkpoint(cp, progress)
        if self._xcom_due():
            self.push(cp, progress)

    def on_finish(self, cp: Checkpoint) -> None:
        super().on_finish(cp)
        self.metrics.finished(cp)
        if self.trace is not None:
            self.trace.finished(cp)
        self.push(cp)

