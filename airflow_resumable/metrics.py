"""Metrics of resumable tasks through Airflow's own ``Stats`` (StatsD or OpenTelemetry, as the
deployment's ``[metrics]`` section configures; nothing is sent when metrics are off).

| name | kind | what |
|---|---|---|
| ``resumable.checkpoint.duration`` | timer (ms) | how long saving a checkpoint took (sampled: the checkpoint of each progress report) |
| ``resumable.items_processed`` | counter | items processed (counted at each progress report and when the attempt ends) |
| ``resumable.cancelled.<reason>`` | counter | attempts that stopped cancelled, by reason (``timeout``, ``user``, ``requested``, ``shutdown``, ``superseded``, ``handover``, ...) |
| ``resumable.paused.<reason>`` | counter | pauses, by reason (``paused``, ``throttled``, ``time_slice``) |
| ``resumable.lease_lost`` | counter | attempts that lost their lease to another attempt |
| ``resumable.done`` | counter | slots finished (``done``) |

Every metric carries the tags ``dag_id`` and ``task_id`` (used by backends with tags: OpenTelemetry,
DogStatsD, InfluxDB). Emitted from the Airflow layer only, a few per progress report: the cost per
checkpoint is two clock reads in the core.
"""

from __future__ import annotations

from typing import Any

from airflow_resumable.core.model.checkpoint import Checkpoint, Status
from airflow_resumable.version_compat import Stats

PREFIX = "resumable"


class Metrics:
    """The metrics of one attempt of a task instance."""

    def __init__(self, *, dag_id: str | None, task_id: str | None):
        self.tags = {"dag_id": dag_id or "", "task_id": task_id or ""}
        self._counted: int | None = None

    def started(self, cp: Checkpoint) -> None:
        """The attempt holds the slot: items already processed are not this attempt's."""
        self._counted = cp.processed

    def checkpoint(self, processed: int, save_seconds: float | None) -> None:
        if save_seconds is not None:
            Stats.timing(f"{PREFIX}.checkpoint.duration", save_seconds * 1000.0, tags=self.tags)
        self._count(processed)

    def finished(self, cp: Checkpoint) -> None:
        """The attempt ended with the slot in ``cp``'s status."""
        self._count(cp.processed)
        if cp.status == Status.CANCELLED:
            Stats.incr(f"{PREFIX}.cancelled.{_name(cp.stop_reason)}", tags=self.tags)
        elif cp.status == Status.PAUSED:
            Stats.incr(f"{PREFIX}.paused.{_name(cp.stop_reason)}", tags=self.tags)
        elif cp.status == Status.DONE:
            Stats.incr(f"{PREFIX}.done", tags=self.tags)

    def lease_lost(self) -> None:
        Stats.incr(f"{PREFIX}.lease_lost", tags=self.tags)

    def _count(self, processed: int) -> None:
        if self._counted is not None and processed > self._counted:
            Stats.incr(f"{PREFIX}.items_processed", processed - self._counted, tags=self.tags)
        self._counted = processed


def _name(reason: Any) -> str:
    """A reason as one segment of a metric name (letters, digits, underscores)."""
    text = str(reason or "unknown")
    return "".join(c if c.isalnum() or c == "_" else "_" for c in text)[:60] or "unknown"
