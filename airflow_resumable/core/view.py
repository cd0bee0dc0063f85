"""A slot as people look at it: the row plus the figures the UI, the REST API and the CLI show.

One place computes them (percent, rate, ETA, lease liveness), so the Checkpoint tab, the jobs
page, ``GET /resumable/api/v1/checkpoint`` and ``airflow resumable show`` agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from airflow_resumable.core.checkpoint import AttemptRecord, Checkpoint
from airflow_resumable.core.control import stale
from airflow_resumable.core.states import AttemptEnd, Status

__all__ = ["ENDED", "row_view"]

#: Statuses with nothing more to watch: the UI stops refreshing.
ENDED = frozenset({Status.DONE, Status.FAILED, Status.CANCELLED})


def row_view(cp: Checkpoint, *, history: Sequence[AttemptRecord] | None = None, offers: dict[str, bool] | None = None,
             now: datetime | None = None) -> dict[str, Any]:
    """The row as plain JSON, with:

    - ``percent``; ``rate`` (items/s) and ``eta_seconds`` of the current attempt, measured from its
      start record in ``history`` (None until it processed something, and while not running);
    - ``lease``: ``none``, ``live``, ``stale`` (the holder missed two heartbeats: taken for dead)
      or ``expired``, and ``heartbeat_age_seconds``;
    - ``live`` (an attempt is under way or paused) and ``ended`` (nothing more to watch);
    - ``offers``: which of pause/resume/cancel/restart/release the slot would take now, when given.
    """
    now = now or datetime.now(tz=timezone.utc)
    out = cp.to_dict()
    lease = "none"
    if cp.lease_owner is not None:
        if cp.lease_expires_at is None or cp.lease_expires_at <= now:
            lease = "expired"
        else:
            lease = "stale" if stale(cp) else "live"
    out["lease"] = lease
    out["heartbeat_age_seconds"] = None if cp.heartbeat_at is None else round((now - cp.heartbeat_at).total_seconds(), 1)
    rate = eta = None
    if cp.status == Status.RUNNING and lease == "live" and history:
        current = _current_attempt(history, cp)
        if current is not None and current.started_at is not None:
            done = cp.processed - current.processed_start
            elapsed = ((cp.updated_at or now) - current.started_at).total_seconds()
            if done > 0 and elapsed > 0:
                rate = done / elapsed
                if cp.total is not None and cp.total >= cp.processed:
                    eta = (cp.total - cp.processed) / rate
    out["rate"] = None if rate is None else round(rate, 2)
    out["eta_seconds"] = None if eta is None else round(eta, 1)
    out["live"] = cp.status == Status.PAUSED or lease in ("live", "stale")
    out["ended"] = cp.status in ENDED and lease != "live"
    if history is not None:
        out["history"] = [h.to_dict() for h in history]
    if offers is not None:
        out["offers"] = offers
    return out


def _current_attempt(history: Sequence[AttemptRecord], cp: Checkpoint) -> AttemptRecord | None:
    """The record of the attempt running the slot now (its lease token's, still running)."""
    for record in reversed(history):
        if record.outcome == AttemptEnd.RUNNING and record.lease_token == cp.lease_token:
            return record
    return None
