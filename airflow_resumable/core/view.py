"""A slot as people look at it: the row plus the figures the UI, the REST API and the CLI show.

One place computes them (percent, rate, ETA, lease liveness), so the Checkpoint tab, the jobs
page, ``GET /resumable/api/v1/checkpoint`` and ``airflow resumable show`` agree.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from airflow_resumable.core.attempt.reporter import eta_of
from airflow_resumable.core.model.checkpoint import AttemptRecord, Checkpoint
from airflow_resumable.core.model.observe import cut_value
from airflow_resumable.core.model.request_rules import Lease, lease_of
from airflow_resumable.core.model.states import FINISHED, Status
from airflow_resumable.core.work.partitions import PLAN_SUFFIX

__all__ = ["ROW_LIMIT", "cap_row", "row_view"]

#: The largest row given whole where rows go out in bulk or to a report channel (the XCom copy,
#: the REST listing), in bytes of JSON; a larger one goes with its large columns cut to a preview.
#: The row in the checkpoint table stays whole, and one slot's row (``GET .../checkpoint``,
#: ``airflow resumable show``) is always given whole.
ROW_LIMIT = 64 * 1024

#: The columns that can grow without bound, and how much of a cut one's JSON the preview keeps.
CUT_FIELDS, PREVIEW = ("position", "state", "resumed_from"), 200

#: Seconds past its ETA, with no checkpoint, after which a running slot is shown as stalled: the
#: rate said the rest would be done by then (the last chunk's jitter is not a stall).
STALL_GRACE = 2.0


def cap_row(row: dict[str, Any], *, marker: str, limit: int = ROW_LIMIT) -> tuple[int, dict[str, int]]:
    """Cut ``row`` (a row as plain JSON) in place when its JSON is over ``limit`` bytes.

    Each of :data:`CUT_FIELDS` whose JSON is over :data:`PREVIEW` characters becomes
    ``{marker: true, "bytes": n, "preview": "<its first 200 characters>..."}``, and ``row[marker]``
    lists the cut columns. A row within the limit is left as it is, without ``marker``.

    Returns:
        the row's size in bytes of JSON before any cut, and the cut columns with the size of each
        one's JSON (empty: nothing was cut).
    """
    size = len(json.dumps(row, default=str))  # ASCII (ensure_ascii): characters are bytes
    if size <= limit:
        return size, {}
    cut = {}
    for name in CUT_FIELDS:
        value, size_of = cut_value(row.get(name), marker=marker, limit=PREVIEW)
        if size_of is not None:
            row[name], cut[name] = value, size_of
    row[marker] = list(cut)
    return size, cut


def row_view(cp: Checkpoint, *, history: Sequence[AttemptRecord] | None = None, offers: dict[str, bool] | None = None,
             now: datetime | None = None) -> dict[str, Any]:
    """The row as plain JSON, with:

    - ``percent``; ``rate`` (items/s) and ``eta_seconds`` of the attempt holding the lease,
      as the holder measured it (:class:`~airflow_resumable.core.attempt.reporter.RateWindow`) and wrote
      it with its last checkpoint, the ETA counting down since (None until measured, and while
      the slot is not running): the numbers of the task's log and XCom;
    - ``stalled_since``: the last checkpoint's time (ISO 8601) when the ETA ran out more than
      :data:`STALL_GRACE` seconds ago without a new checkpoint while the lease is live (a chunk, or
      the work after the last checkpoint, taking longer than the rate predicts); ``eta_seconds``
      is then None instead of a 0 that would never move. None otherwise;
    - ``lease``: ``none``, ``live``, ``stale`` (the holder missed two heartbeats: taken for dead)
      or ``expired``, and ``heartbeat_age_seconds``;
    - ``live`` (an attempt is under way or paused) and ``ended`` (nothing more to watch);
    - ``offers``: which of pause/resume/cancel/restart/release the slot would take now, when given;
    - ``kind``: ``plan`` for a partitioned job's plan row (``<job>#plan``: the job's split, stored
      once per slot, not work), ``slot`` for every other row.
    """
    now = now or datetime.now(tz=timezone.utc)
    out = cp.to_dict()
    out["kind"] = "plan" if cp.job.endswith(PLAN_SUFFIX) else "slot"
    lease = lease_of(cp, now)
    out["lease"] = lease.value
    out["heartbeat_age_seconds"] = None if cp.heartbeat_at is None else round((now - cp.heartbeat_at).total_seconds(), 1)
    rate = eta = stalled = None
    if cp.status == Status.RUNNING and lease is Lease.LIVE and cp.updated_at is not None:
        # The holder's own measure, written with its last checkpoint (core/attempt/reporter.py)
        rate = cp.rate
        since = (now - cp.updated_at).total_seconds()
        left = eta_of(rate, cp.processed, cp.total)  # as of the last checkpoint
        if left is not None and since > left + STALL_GRACE:
            stalled = cp.updated_at
        else:
            eta = eta_of(rate, cp.processed, cp.total, since=since)
    out["rate"] = None if rate is None else round(rate, 2)
    out["eta_seconds"] = None if eta is None else round(eta, 1)
    out["stalled_since"] = None if stalled is None else stalled.isoformat()
    out["live"] = cp.status == Status.PAUSED or lease in (Lease.LIVE, Lease.STALE)
    # Nothing more to watch (the UI stops refreshing): a finished status nobody runs any more.
    out["ended"] = cp.status in FINISHED and lease is not Lease.LIVE
    if history is not None:
        out["history"] = [h.to_dict() for h in history]
    if offers is not None:
        out["offers"] = offers
    return out
