"""A row as it leaves the core: every shape it takes outside, and the figures and cuts they share.

One module makes them all: the XCom copy (:func:`xcom_row`), the task's return value
(:func:`task_summary`), the summary in Airflow's task state store (:func:`state_store_summary`), the
row as the Checkpoint tab, the jobs page, the REST API and the CLI show it (:func:`row_view`,
:func:`listed_row`, :func:`slot_detail`), and an attempt as lineage and tracing carry it
(:func:`facts_json`), and a job's line on the jobs page, its REST listing and ``airflow resumable jobs``
(:func:`job_line`). Each figure is computed here once: the percent (:func:`percent_of`, capped at
100), the ETA (:func:`eta_of`) and the lease's liveness; and one rule cuts a value too large for where
it goes (:func:`cut_value`), so every channel agrees on what a slot shows. Every text a shape carries
(an error, a stop reason, who asked, the names) goes through
:func:`~airflow_resumable.core.model.outward.outward_text` here, once for every channel: no credential,
no raw control character leaves by REST, the CLI, XCom, the UI, lineage or tracing. The row's JSON
values (position, state, result, reader) go as they are, as JSON.

The Airflow layer only calls these; nothing here does I/O (the reads are ``airflow_resumable.control``'s).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from airflow_resumable.core.model.checkpoint import AttemptRecord, Checkpoint, DeadLetter
from airflow_resumable.core.model.identity import PLAN_SUFFIX
from airflow_resumable.core.model.observe import (
    ELLIPSIS,
    TEXT_LIMIT,
    VALUE_LIMIT,
    AttemptFacts,
    cut_text,
    outward_text,
    stop_reason_text,
)
from airflow_resumable.core.model.request_rules import Lease, lease_of
from airflow_resumable.core.model.states import FINISHED, Status

__all__ = [
    "CUT_MARKER", "ROW_LIMIT", "STATE_STORE_POSITION_LIMIT", "XCOM_MARKER", "cap_row", "cut_value", "eta_of",
    "facts_json", "job_line", "listed_row", "outward_fields", "percent_of", "record_json", "row_json", "row_view",
    "skipped_view", "slot_detail",
    "state_store_summary", "task_summary", "xcom_row",
]

#: The largest row given whole where rows go out in bulk or to a report channel (the XCom copy,
#: the REST listing), in bytes of JSON; a larger one goes with its large columns cut to a preview.
#: The row in the checkpoint table stays whole, and one slot's row (``GET .../checkpoint``,
#: ``airflow resumable show``) is always given whole.
ROW_LIMIT = 64 * 1024

#: The columns that can grow without bound, and how much of a cut one's JSON the preview keeps.
CUT_FIELDS, PREVIEW = ("position", "state", "resumed_from"), 200

#: What marks a cut value, and lists a row's cut columns: ``xcom_truncated`` in the XCom copy (its
#: documented key since the first release), ``truncated`` everywhere else (REST, the task state
#: store, lineage and tracing).
XCOM_MARKER, CUT_MARKER = "xcom_truncated", "truncated"

#: The longest position the task state store's summary carries whole, in characters of JSON.
STATE_STORE_POSITION_LIMIT = 512

#: How much of a skipped item's error the task's return value keeps, in characters.
SUMMARY_ERROR_LIMIT = 200

#: Seconds past its ETA, with no checkpoint, after which a running slot is shown as stalled: the
#: rate said the rest would be done by then (the last chunk's jitter is not a stall).
STALL_GRACE = 2.0


# -- the figures ------------------------------------------------------------------------------------

def percent_of(processed: int, total: int | None) -> float | None:
    """Progress in percent, to two decimals, never over 100 (a total edited by hand below what was
    processed shows 100); None while the total is unknown or 0."""
    if not total:
        return None
    return round(min(100.0, 100.0 * processed / total), 2)


def eta_of(rate: float | None, processed: int, total: int | None, *, since: float = 0.0) -> float | None:
    """Seconds left at ``rate`` for ``total - processed`` items, ``since`` seconds after they were
    counted (a look between two checkpoints sees the ETA count down); None when not measured."""
    if rate is None or rate <= 0 or total is None or total < processed:
        return None
    return max(0.0, (total - processed) / rate - max(0.0, since))


def _rounded(rate: float | None, eta: float | None) -> dict[str, float | None]:
    return {"rate": None if rate is None else round(rate, 2), "eta_seconds": None if eta is None else round(eta, 1)}


# -- the one cut rule -------------------------------------------------------------------------------

def cut_value(value: Any, *, marker: str = CUT_MARKER, limit: int = PREVIEW) -> tuple[Any, int | None]:
    """``value`` as it goes out: itself when its JSON is at most ``limit`` characters, else
    ``{marker: true, "bytes": n, "preview": "<its first limit characters>..."}`` (the preview at most
    ``limit + 3`` characters). Every channel cuts a value by this rule, each with its own limit.

    Returns:
        the value to send, and the size of the cut value's JSON (None: nothing was cut).
    """
    text = json.dumps(value, default=str)  # ASCII (ensure_ascii): characters are bytes
    if len(text) <= limit:
        return value, None
    return {marker: True, "bytes": len(text), "preview": cut_text(text, limit + len(ELLIPSIS))}, len(text)


def cap_row(row: dict[str, Any], *, marker: str = CUT_MARKER, limit: int = ROW_LIMIT) -> tuple[int, dict[str, int]]:
    """Cut ``row`` (a row as plain JSON) in place when its JSON is over ``limit`` bytes.

    Each of :data:`CUT_FIELDS` whose JSON is over :data:`PREVIEW` characters is cut
    (:func:`cut_value`), and ``row[marker]`` lists the cut columns. A row within the limit is left
    as it is, without ``marker``.

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


# -- the texts --------------------------------------------------------------------------------------

#: The columns that hold JSON values (data, not text about the attempt): they go as they are.
DATA_FIELDS = frozenset({"position", "state", "resumed_from", "result", "reader", "position_start", "position_end",
                         "item"})


def outward_fields(out: dict[str, Any]) -> dict[str, Any]:
    """``out`` (a row or a record as plain JSON) with each of its texts through
    :func:`~airflow_resumable.core.model.outward.outward_text`, in place; the JSON values of
    :data:`DATA_FIELDS` are left as they are."""
    for name, value in out.items():
        if isinstance(value, str) and name not in DATA_FIELDS:
            out[name] = outward_text(value)
    return out


def _text(value: str | None) -> str | None:
    return None if value is None else outward_text(value)


def _name(name: str) -> str:
    """A job's or a slot's name as an event carries it: through ``outward_text``, then cut to
    ``TEXT_LIMIT`` characters (a one-word name keeps its start)."""
    return cut_text(outward_text(name), TEXT_LIMIT)


# -- the shapes -------------------------------------------------------------------------------------

def row_json(cp: Checkpoint) -> dict[str, Any]:
    """The row as plain JSON (timestamps as ISO 8601, the deprecated names too) with its ``percent``,
    its texts through :func:`outward_fields`: what every other shape of a whole row starts from."""
    out = outward_fields(cp.to_dict())
    out["percent"] = percent_of(cp.processed, cp.total)
    return out


def record_json(record: AttemptRecord) -> dict[str, Any]:
    """One record of a slot's history (an attempt, a request) as plain JSON, its texts (the error, the
    stop reason, who asked) through :func:`outward_fields`: as REST, the Checkpoint tab and
    ``airflow resumable history`` show it."""
    return outward_fields(record.to_dict())


def xcom_row(cp: Checkpoint, *, rate: float | None = None, eta: float | None = None,
             measured: bool = False) -> tuple[dict[str, Any], int, dict[str, int]]:
    """The row as pushed to XCom (key ``checkpoint``): whole up to :data:`ROW_LIMIT` bytes of JSON,
    else with each large position/state replaced by ``{"xcom_truncated": true, "bytes": n,
    "preview": ...}`` and the cut columns listed under ``xcom_truncated``. With ``measured`` (a
    checkpoint's push), the attempt's ``rate`` and ``eta_seconds`` too: the log line's figures.

    Returns:
        the row, its size in bytes of JSON before any cut, and the cut columns (see :func:`cap_row`).
    """
    row = row_json(cp)
    if measured:
        row.update(_rounded(rate, eta))
    size, cut = cap_row(row, marker=XCOM_MARKER, limit=ROW_LIMIT)
    return row, size, cut


def task_summary(cp: Checkpoint, *, skipped: int | None = None,
                 skipped_items: Sequence[DeadLetter] | None = None) -> dict[str, Any]:
    """The task's return value when the handler returns None: the row's figures (``job``, ``slot``,
    ``position``, ``processed``, ``total``, ``status``, ``attempts``, ``resumed_from``), given whole.
    Built from the stored row only, so an attempt that finds the slot already done returns the same.
    With a skip policy, also ``skipped`` (how many) and ``skipped_items`` (the first few:
    ``position``, ``error`` cut to 200 characters, ``attempt``)."""
    out = {"job": outward_text(cp.job), "slot": outward_text(cp.slot), "position": cp.position,
           "processed": cp.processed, "total": cp.total, "status": cp.status, "attempts": cp.attempts,
           "resumed_from": cp.resumed_from}
    if skipped is not None:
        out["skipped"] = skipped
    if skipped_items is not None:
        out["skipped_items"] = [{"position": d.position, "error": outward_text(d.error or "", SUMMARY_ERROR_LIMIT),
                                 "attempt": d.attempt} for d in skipped_items]
    return out


def state_store_summary(cp: Checkpoint, *, link: str) -> dict[str, Any]:
    """The summary in Airflow's task state store (key ``resumable``): ``job``, ``slot``, ``status``,
    ``position`` (cut over :data:`STATE_STORE_POSITION_LIMIT` characters of JSON, marked
    ``truncated``), ``processed``, ``total``, ``percent``, ``updated_at`` and ``checkpoint_tab``
    (``link``: the task instance's Checkpoint tab)."""
    position, _ = cut_value(cp.position, marker=CUT_MARKER, limit=STATE_STORE_POSITION_LIMIT)
    return {"job": outward_text(cp.job), "slot": outward_text(cp.slot), "status": cp.status, "position": position,
            "processed": cp.processed,
            "total": cp.total, "percent": percent_of(cp.processed, cp.total),
            "updated_at": cp.updated_at.isoformat() if cp.updated_at else None, "checkpoint_tab": link}


def row_view(cp: Checkpoint, *, history: Sequence[AttemptRecord] | None = None, offers: dict[str, bool] | None = None,
             now: datetime | None = None) -> dict[str, Any]:
    """The row as plain JSON, as the Checkpoint tab, the jobs page, REST and the CLI show it, with:

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
    out = row_json(cp)
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
    out.update(_rounded(rate, eta))
    out["stalled_since"] = None if stalled is None else stalled.isoformat()
    out["live"] = cp.status == Status.PAUSED or lease in (Lease.LIVE, Lease.STALE)
    # Nothing more to watch (the UI stops refreshing): a finished status nobody runs any more.
    out["ended"] = cp.status in FINISHED and lease is not Lease.LIVE
    if history is not None:
        out["history"] = [record_json(h) for h in history]
    if offers is not None:
        out["offers"] = offers
    return out


def listed_row(cp: Checkpoint, *, now: datetime | None = None) -> dict[str, Any]:
    """A row among many (the REST listing, a job's partitions): :func:`row_view`, cut to
    :data:`ROW_LIMIT` (a listing must not grow with the states: five 10 MB states were a 52 MB
    answer), the cut columns listed under ``truncated``."""
    view = row_view(cp, now=now)
    cap_row(view, marker=CUT_MARKER, limit=ROW_LIMIT)
    return view


def skipped_view(letters: Sequence[DeadLetter], counts: Mapping[str, int], asked: str | None) -> dict[str, Any]:
    """A slot's skipped items as the Checkpoint tab and the CLI show them: ``skipped_items``
    (``position``, ``error``, ``attempt``, ``skipped_at``, ``state``: ``skipped``, ``replayed`` or
    ``retry_requested``), ``skipped_counts`` (how many items are in each state, all of them, not
    only those listed), ``skipped_total`` (those still skipped or waiting for their retry) and
    ``retry_requested_by`` (``asked``: who asked for the retry still pending, else None)."""
    return {"skipped_items": [{"position": d.position, "error": _text(d.error), "attempt": d.attempt,
                               "skipped_at": d.recorded_at.isoformat() if d.recorded_at else None,
                               "state": outward_text(d.status)} for d in letters],
            "skipped_counts": dict(counts), "skipped_total": counts["skipped"] + counts["retry_requested"],
            "retry_requested_by": _text(asked)}


def slot_detail(cp: Checkpoint, *, history: Sequence[AttemptRecord], offers: dict[str, bool],
                notes: dict[str, str] | None = None, skipped: dict[str, Any] | None = None,
                now: datetime | None = None) -> dict[str, Any]:
    """One slot whole (``GET .../checkpoint``, the Checkpoint tab, ``airflow resumable show``):
    :func:`row_view` with its ``history`` and ``offers``; with ``notes``, ``offer_notes`` (what each
    request would do to the slot now, or why not: the buttons' tooltips); with ``skipped``, the
    slot's :func:`skipped_view`."""
    view = row_view(cp, history=history, offers=offers, now=now)
    if notes is not None:
        view["offer_notes"] = {action: outward_text(note) for action, note in notes.items()}
    if skipped is not None:
        view.update(skipped)
    return view


def job_line(*, job: str, dag_id: str | None, task_id: str | None, run_id: str | None, slot: str, mapped: bool,
             partitioned: bool, counts: Mapping[str, int], processed: int, totals_known: bool, total: int,
             planned_rows: int | None, skipped: int, rate: float, updated: datetime | None,
             plan_request: dict[str, Any] | None) -> dict[str, Any]:
    """A job's line (the jobs page, its REST listing, ``airflow resumable jobs``): its partitions
    counted by how they stand (``counts``, ``waiting`` included), and its progress as the sum of
    theirs. ``total`` is the partitions' totals added up, shown once each has counted its range
    (``totals_known``) and none waits; before that, the rows the plan counted when it split the
    source (``planned_rows``), else unknown. ``rate``, the running partitions' rates added up, is
    shown only while one runs."""
    n = sum(counts.values())
    shown: int | None = total if totals_known and not counts.get("waiting") else planned_rows
    if shown is not None:
        shown = max(shown, processed) if counts.get("done", 0) < n else shown
    live = rate if counts.get("running") and rate > 0 else None
    return {
        "job": outward_text(job), "dag_id": _text(dag_id), "task_id": _text(task_id), "run_id": _text(run_id),
        "slot": outward_text(slot), "mapped": mapped, "partitioned": partitioned,
        "partitions": {**counts, "total": n},
        # The plan's rows (a partitioned job), and the partitions' dead letters not replayed:
        # processed counts them too (a skipped item is read), the summary task tells them apart.
        "planned": planned_rows, "processed": processed, "skipped": skipped, "total": shown,
        "percent": percent_of(processed, shown),
        **_rounded(live, eta_of(live, processed, shown)),
        "updated_at": updated.isoformat() if updated else None,
        "plan_request": None if plan_request is None else outward_fields(dict(plan_request)),
    }


def facts_json(facts: AttemptFacts) -> dict[str, Any]:
    """An attempt as lineage events and spans carry it, small: positions and bounds over
    :data:`~airflow_resumable.core.model.observe.VALUE_LIMIT` characters of JSON are cut
    (:func:`cut_value`, marked ``truncated``), the stop reason (a handler's own may hold a DSN)
    loses its credentials and is cut to :data:`~airflow_resumable.core.model.observe.REASON_LIMIT`
    characters, names (through ``outward_text`` too) to ``TEXT_LIMIT`` (``cut_text``); None values are left out."""
    out: dict[str, Any] = {"job": _name(facts.job), "slot": None if facts.slot is None else _name(facts.slot),
                           "attempt": facts.attempt, "status": facts.status, "resumed": facts.resumed,
                           "processed": facts.processed, "total": facts.total, "skipped": facts.skipped,
                           "stop_reason": None if facts.stop_reason is None else stop_reason_text(facts.stop_reason),
                           "checkpoints": facts.checkpoints}
    for name in ("resumed_from", "position"):
        if getattr(facts, name) is not None:
            out[name] = cut_value(getattr(facts, name), marker=CUT_MARKER, limit=VALUE_LIMIT)[0]
    if facts.partition is not None:
        p = facts.partition
        out["partition"] = {"job": _name(p.job), "index": p.index, "count": p.count,
                            "after": cut_value(p.after, marker=CUT_MARKER, limit=VALUE_LIMIT)[0],
                            "until": cut_value(p.until, marker=CUT_MARKER, limit=VALUE_LIMIT)[0]}
    return {k: v for k, v in out.items() if v is not None}
