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

import dataclasses
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
from airflow_resumable.core.model.process import holder_process
from airflow_resumable.core.model.request_rules import Lease, lease_of
from airflow_resumable.core.model.states import FINISHED, Status

__all__ = [
    "CUT_MARKER", "ROW_LIMIT", "STATE_STORE_POSITION_LIMIT", "TI_ENDED", "XCOM_MARKER", "Liveness", "cap_row",
    "cut_value", "eta_of", "facts_json", "job_line", "listed_row", "liveness_of", "outward_fields", "percent_of", "record_json", "row_json", "row_view",
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


#: Airflow's task instance states in which no try of the task instance runs: a slot whose row still
#: says ``running`` then has nobody behind it, whatever its lease says.
TI_ENDED = frozenset({"success", "failed", "skipped", "upstream_failed", "removed", "up_for_retry"})

#: How a slot may be shown besides its stored statuses (``running``, ``paused``, ``done``, ``failed``,
#: ``cancelled``): a running row whose holder is stuck, or gone.
STALLED, ABANDONED = "stalled", "abandoned"


@dataclasses.dataclass(frozen=True)
class Liveness:
    """What a slot is shown as now (:func:`liveness_of`): every surface takes it from here."""

    #: The stored status, or for a ``running`` row: ``running``, ``stalled`` (its holder is alive by
    #: its lease but missed two heartbeats, or is past its ETA with no checkpoint) or ``abandoned``
    #: (nobody runs it: its lease expired or was released, or its task instance ended).
    shown: str
    #: Since when it is stalled or abandoned (None otherwise).
    since: datetime | None = None
    #: The attempt last holding the slot (its lease owner, else ``try N``) when stalled or abandoned.
    last_holder: str | None = None
    #: Why, in words (None when ``shown`` is the stored status and nothing more is to be said).
    why: str | None = None
    #: The holder's rate (items/s) and the ETA counting down, only while shown ``running``.
    rate: float | None = None
    eta: float | None = None
    #: Seconds since the last checkpoint (the ETA counts down from it), while shown ``running``.
    age: float | None = None
    #: The row's own status (what a job's line counts it under until it is shown otherwise).
    stored: str = Status.RUNNING.value

    @property
    def stalled_since(self) -> datetime | None:
        return self.since if self.shown == STALLED else None

    def json(self) -> dict[str, Any]:
        return {"shown_status": self.shown, "shown_since": None if self.since is None else self.since.isoformat(),
                "last_holder": _text(self.last_holder), "shown_why": _text(self.why)}


#: How long past its expiry a lease whose process still runs is taken for a holder that waits (then
#: abandoned as any lapsed lease is): this many leases, at least :data:`WAITS_AT_LEAST` seconds.
WAITS_FOR_LEASES, WAITS_AT_LEAST = 10, 60.0


def _long_lapsed(cp: Checkpoint, now: datetime) -> bool:
    """Whether ``cp``'s lease lapsed so long ago that a process running under its owner's pid is no
    longer taken for its holder waiting (an unrelated process, a pid named by a hand)."""
    if cp.lease_expires_at is None:
        return True
    lease = (cp.lease_expires_at - cp.heartbeat_at).total_seconds() if cp.heartbeat_at else 0.0
    return (now - cp.lease_expires_at).total_seconds() > max(WAITS_AT_LEAST, WAITS_FOR_LEASES * lease)


def _iso(at: datetime | None) -> str:
    return "?" if at is None else at.isoformat()


def liveness_of(cp: Checkpoint, now: datetime, *, ti_state: str | None = None) -> Liveness:
    """How ``cp``'s slot stands at ``now``: the one rule for every surface (the Checkpoint tab, the
    jobs page's lines and partitions, REST, ``airflow resumable show`` and ``jobs``).

    A row is never rewritten by a reader: a ``running`` row whose attempt is gone stays ``running``
    in the table until the next attempt takes its lease (and writes the truth), or a request
    changes it. What is shown is judged here, every time it is read:

    - ``abandoned`` when nobody runs it: its lease expired (``since``: the expiry) or was released
      (``since``: the last heartbeat), or Airflow says its task instance ended (``ti_state``, when the
      caller knows it: one of :data:`TI_ENDED`);
    - ``stalled`` when its holder holds an unexpired lease but missed two heartbeats (``since``: the
      last heartbeat), or its ETA ran out more than :data:`STALL_GRACE` seconds ago with no new
      checkpoint (``since``: the last checkpoint), or its process on this host
      (:func:`~airflow_resumable.core.model.process.holder_process`) is stopped, or gone while its
      lease still holds the slot (a SIGKILL is seen at once; the requests take the slot as nobody's
      once the lease lapses); and when its lease lapsed less than :data:`WAITS_FOR_LEASES` leases ago
      while its process on this host still runs (waiting for SQLite's write lock behind another
      partition's chunk: not dead);
    - ``running`` otherwise, with the holder's ``rate`` and the ``eta`` counting down since its last
      checkpoint;
    - a ``paused`` row ``abandoned`` when Airflow says its task instance ended other than for a
      retry (``pause_timeout`` with no retry left, a person marking it failed): nothing waits for a
      resume; any other status as it is stored.
    """
    if cp.status == Status.PAUSED and ti_state is not None and ti_state in TI_ENDED and ti_state != "up_for_retry":
        return Liveness(ABANDONED, cp.updated_at, f"try {cp.attempt}",
                        f"paused, and its task instance is {ti_state} in Airflow: nothing waits for a resume. Clear "
                        "the task instance (its next try waits, paused, for a Resume), or Restart or Cancel the slot",
                        stored=Status.PAUSED.value)
    if cp.status != Status.RUNNING:
        return Liveness(str(cp.status), stored=str(cp.status))
    lease = lease_of(cp, now)
    holder = cp.lease_owner or f"try {cp.attempt}"
    process = holder_process(cp.lease_owner, cp.lease_acquired_at) if lease is not Lease.NONE else None
    if process is not None and process.state == "gone" and lease is not Lease.EXPIRED and (
            ti_state is None or ti_state not in TI_ENDED):
        # Dead, but its lease still holds the slot, and the requests are judged by the lease: shown
        # stalled, saying so, until the lease lapses (then abandoned, as the requests take it)
        return Liveness(STALLED, cp.heartbeat_at or cp.updated_at, holder,
                        f"{process.describe()} (last heartbeat {_iso(cp.heartbeat_at)}): nobody runs this slot, but "
                        f"its lease holds it until {_iso(cp.lease_expires_at)}; a forced Release (release --force) frees it now, "
                        "Restart takes it "
                        "once the lease lapses")
    if lease is Lease.EXPIRED and process is not None and process.state == "runs" and (
            ti_state is None or ti_state not in TI_ENDED) and not _long_lapsed(cp, now):
        since = cp.lease_expires_at or cp.heartbeat_at or cp.updated_at
        return Liveness(STALLED, since, holder,
                        f"its lease lapsed at {_iso(since)} (last heartbeat {_iso(cp.heartbeat_at)}) but "
                        f"{process.describe()}: it is waiting (for SQLite's write lock, behind another writer's long "
                        "chunk) or stuck; another attempt that takes the slot over fences it out")
    if lease is Lease.EXPIRED:
        since = cp.lease_expires_at or cp.heartbeat_at or cp.updated_at
        return Liveness(ABANDONED, since, holder,
                        f"nobody runs this slot: the lease of {holder} expired at {_iso(since)} (last heartbeat "
                        f"{_iso(cp.heartbeat_at)}) and no attempt took it since")
    if lease is Lease.NONE:
        since = cp.heartbeat_at or cp.updated_at
        return Liveness(ABANDONED, since, holder,
                        f"nobody runs this slot: its lease was released (last holder {holder}, last heartbeat "
                        f"{_iso(cp.heartbeat_at)}) and no attempt took it since")
    if ti_state is not None and ti_state in TI_ENDED:
        since = cp.heartbeat_at or cp.updated_at
        return Liveness(ABANDONED, since, holder,
                        f"nobody runs this slot: its task instance is {ti_state} in Airflow (last holder {holder}, "
                        f"last heartbeat {_iso(cp.heartbeat_at)}; its lease lapses at {_iso(cp.lease_expires_at)})")
    if process is not None and process.state == "stopped":
        return Liveness(STALLED, cp.heartbeat_at, holder,
                        f"{process.describe()}: it holds the lease until {_iso(cp.lease_expires_at)} and does "
                        f"nothing (last heartbeat {_iso(cp.heartbeat_at)}); `kill -CONT {process.pid}` continues it")
    if lease is Lease.STALE:
        return Liveness(STALLED, cp.heartbeat_at, holder,
                        f"its holder {holder} missed two heartbeats (last {_iso(cp.heartbeat_at)}); its lease "
                        f"expires at {_iso(cp.lease_expires_at)} unless it heartbeats again")
    if cp.updated_at is None:
        return Liveness(Status.RUNNING.value)
    # The holder's own measure, written with its last checkpoint (core/attempt/reporter.py)
    age = (now - cp.updated_at).total_seconds()
    left = eta_of(cp.rate, cp.processed, cp.total)  # as of the last checkpoint
    if left is not None and age > left + STALL_GRACE:
        return Liveness(STALLED, cp.updated_at, holder,
                        f"past its ETA with no checkpoint since {_iso(cp.updated_at)} (its holder {holder} still "
                        "heartbeats: a chunk, or the work after the last checkpoint, takes longer than its rate "
                        "predicts)", rate=cp.rate)
    return Liveness(Status.RUNNING.value, rate=cp.rate, eta=eta_of(cp.rate, cp.processed, cp.total, since=age),
                    age=age)


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


#: The ``status`` of a copy of a running row that an attempt hands to Airflow (XCom, the task state
#: store): "this attempt saved this checkpoint" (at ``updated_at``) and the slot is not finished.
#: A copy outlives the process that wrote it (a SIGKILL leaves it behind, and nothing of ours
#: writes a task instance's XCom afterwards), so it never says ``running``: what runs now is
#: judged when read, by :func:`liveness_of`, on the Checkpoint tab, the jobs page, REST and the CLI.
CHECKPOINTED = "checkpointed"


def reported_status(cp: Checkpoint) -> str:
    """The status a copy of ``cp`` handed to Airflow carries: :data:`CHECKPOINTED` for a running
    row, else the row's own (``done``, ``failed``, ``paused`` ...: final for that attempt)."""
    return CHECKPOINTED if cp.status == Status.RUNNING else str(cp.status)


def xcom_row(cp: Checkpoint, *, rate: float | None = None, eta: float | None = None,
             measured: bool = False) -> tuple[dict[str, Any], int, dict[str, int]]:
    """The row as pushed to XCom (key ``checkpoint``): whole up to :data:`ROW_LIMIT` bytes of JSON,
    else with each large position/state replaced by ``{"xcom_truncated": true, "bytes": n,
    "preview": ...}`` and the cut columns listed under ``xcom_truncated``. With ``measured`` (a
    checkpoint's push), the attempt's ``rate`` and ``eta_seconds`` too: the log line's figures.
    Its ``status`` is :func:`reported_status`'s: a copy never says ``running``.

    Returns:
        the row, its size in bytes of JSON before any cut, and the cut columns (see :func:`cap_row`).
    """
    row = row_json(cp)
    row["status"] = reported_status(cp)
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
    (``link``: the task instance's Checkpoint tab). Its ``status`` is :func:`reported_status`'s."""
    position, _ = cut_value(cp.position, marker=CUT_MARKER, limit=STATE_STORE_POSITION_LIMIT)
    return {"job": outward_text(cp.job), "slot": outward_text(cp.slot), "status": reported_status(cp),
            "position": position,
            "processed": cp.processed,
            "total": cp.total, "percent": percent_of(cp.processed, cp.total),
            "updated_at": cp.updated_at.isoformat() if cp.updated_at else None, "checkpoint_tab": link}


def row_view(cp: Checkpoint, *, history: Sequence[AttemptRecord] | None = None, offers: dict[str, bool] | None = None,
             now: datetime | None = None, ti_state: str | None = None) -> dict[str, Any]:
    """The row as plain JSON, as the Checkpoint tab, the jobs page, REST and the CLI show it, with:

    - ``shown_status``: what the slot is shown as (:func:`liveness_of`: the stored ``status``, or for
      a running row ``stalled`` or ``abandoned``), with ``shown_since``, ``last_holder`` and
      ``shown_why`` when stalled or abandoned (``ti_state``: the task instance's state in Airflow,
      when the caller knows it);
    - ``percent``; ``rate`` (items/s) and ``eta_seconds`` of the attempt holding the lease,
      as the holder measured it (:class:`~airflow_resumable.core.attempt.reporter.RateWindow`) and wrote
      it with its last checkpoint, the ETA counting down since (None until measured, and while
      the slot is not running): the numbers of the task's log and XCom;
    - ``stalled_since``: ``shown_since`` when shown ``stalled`` (the last checkpoint's time when
      the ETA ran out more than :data:`STALL_GRACE` seconds ago without a new checkpoint while the
      lease is live; the last heartbeat when the holder missed two); ``eta_seconds`` is then None
      instead of a 0 that would never move. None otherwise;
    - ``lease``: ``none``, ``live``, ``stale`` (the holder missed two heartbeats: taken for dead)
      or ``expired``, and ``heartbeat_age_seconds``;
    - ``live`` (an attempt is under way or paused; not when abandoned) and ``ended`` (nothing more to watch);
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
    shown = liveness_of(cp, now, ti_state=ti_state)
    out.update(shown.json())
    out.update(_rounded(shown.rate, shown.eta))
    out["stalled_since"] = None if shown.stalled_since is None else shown.stalled_since.isoformat()
    out["live"] = shown.shown != ABANDONED and (cp.status == Status.PAUSED or lease in (Lease.LIVE, Lease.STALE))
    # Nothing more to watch (the UI stops refreshing): a finished status nobody runs any more.
    out["ended"] = cp.status in FINISHED and lease is not Lease.LIVE
    if history is not None:
        out["history"] = [record_json(h) for h in history]
    if offers is not None:
        out["offers"] = offers
    return out


def listed_row(cp: Checkpoint, *, now: datetime | None = None, ti_state: str | None = None) -> dict[str, Any]:
    """A row among many (the REST listing, a job's partitions): :func:`row_view`, cut to
    :data:`ROW_LIMIT` (a listing must not grow with the states: five 10 MB states were a 52 MB
    answer), the cut columns listed under ``truncated``."""
    view = row_view(cp, now=now, ti_state=ti_state)
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


def _dead(cp: Checkpoint) -> bool:
    """Whether ``cp``'s holder's process on this host is gone (a SIGKILL), its lease still holding the slot."""
    process = holder_process(cp.lease_owner, cp.lease_acquired_at)
    return process is not None and process.state == "gone"


def slot_detail(cp: Checkpoint, *, history: Sequence[AttemptRecord], offers: dict[str, bool],
                notes: dict[str, str] | None = None, skipped: dict[str, Any] | None = None,
                now: datetime | None = None, ti_state: str | None = None) -> dict[str, Any]:
    """One slot whole (``GET .../checkpoint``, the Checkpoint tab, ``airflow resumable show``):
    :func:`row_view` with its ``history`` and ``offers``; with ``notes``, ``offer_notes`` (what each
    request would do to the slot now, or why not: the buttons' tooltips); with ``skipped``, the
    slot's :func:`skipped_view`. A slot shown ``abandoned`` because its task instance ended
    (``ti_state``) while its lease has not lapsed yet offers no pause: nobody would see it; nor does one
    shown stalled because its holder's process is gone (killed: its lease still holds the slot)."""
    view = row_view(cp, history=history, offers=offers, now=now, ti_state=ti_state)
    if offers.get("resume") and cp.status == Status.PAUSED and view["shown_status"] == ABANDONED:
        view["offers"] = offers = {**offers, "resume": False}
        if notes is not None:
            notes = {**notes, "resume": f"Not now: {view['shown_why']}."}
    if offers.get("pause") and (view["shown_status"] == ABANDONED or (view["shown_status"] == STALLED and _dead(cp))):
        view["offers"] = offers = {**offers, "pause": False}
        if notes is not None:
            notes = {**notes, "pause": f"Not now: {view['shown_why']}. Restart it, or Clear its task instance in "
                     "Airflow to resume it from its checkpoint."}
    if notes is not None:
        view["offer_notes"] = {action: outward_text(note) for action, note in notes.items()}
    if skipped is not None:
        view.update(skipped)
    return view


def job_line(*, job: str, dag_id: str | None, task_id: str | None, run_id: str | None, slot: str, mapped: bool,
             partitioned: bool, counts: Mapping[str, int], processed: int, totals_known: bool, total: int,
             planned_rows: int | None, skipped: int, running: Sequence[Liveness], updated: datetime | None,
             plan_request: dict[str, Any] | None, task_states: Mapping[int, str] | None = None,
             splits: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """A job's line (the jobs page, its REST listing, ``airflow resumable jobs``): its partitions
    counted by how they are shown (``counts``, ``waiting`` included: a running row is counted as
    :func:`liveness_of` shows it, ``running``, ``stalled`` or ``abandoned``), and its progress as the
    sum of theirs. ``total`` is the partitions' totals added up, shown once each has counted its range
    (``totals_known``) and none waits; before that, the rows the plan counted when it split the
    source (``planned_rows``), else unknown.

    ``running`` is each running row's :class:`Liveness`, by the rule its own detail is shown with:
    ``rate`` adds up the rates their details show (a holder's own measure, never an abandoned
    row's); the ETA counts down from the latest checkpoint of those shown running
    checkpoint, as a slot's does (a job of one partition shows its partition's figures); while one
    is stalled, the line is ``stalled_since`` the earliest such partition, with no ETA (the rate no
    longer says when it ends). ``task_states`` (Airflow's task instances of the run by map index,
    when the caller knows them) give ``task_instances``: how many are in each state, as Airflow
    shows them (None: not known). ``splits``: the ranges rebalancing took from running partitions,
    in the order they were agreed, each as the caller read it, its texts through ``outward_text``
    already (a partitioned job's; a partition with ranges taken from it is still counted once, as
    its line stands)."""
    n = sum(counts.values())
    shown: int | None = total if totals_known and not counts.get("waiting") else planned_rows
    if shown is not None:
        shown = max(shown, processed) if counts.get("done", 0) < n else shown
    moving = [lv for lv in running if lv.shown == Status.RUNNING]
    stuck = [lv.since for lv in running if lv.stalled_since is not None and lv.since is not None]
    rate = sum(lv.rate or 0.0 for lv in running if lv.rate is not None)
    live = rate if rate > 0 else None
    ages = [lv.age for lv in moving if lv.age is not None]
    eta = None if stuck else eta_of(live, processed, shown, since=min(ages) if ages else 0.0)
    return {
        "job": outward_text(job), "dag_id": _text(dag_id), "task_id": _text(task_id), "run_id": _text(run_id),
        "slot": outward_text(slot), "mapped": mapped, "partitioned": partitioned,
        "partitions": {**counts, "total": n},
        # The plan's rows (a partitioned job), and the partitions' dead letters not replayed:
        # processed counts them too (a skipped item is read), the summary task tells them apart.
        "planned": planned_rows, "processed": processed, "skipped": skipped, "total": shown,
        "percent": percent_of(processed, shown),
        **_rounded(live, eta),
        "stalled_since": _first(stuck),
        "abandoned_since": _first(lv.since for lv in running if lv.shown == ABANDONED),
        "updated_at": updated.isoformat() if updated else None,
        "plan_request": None if plan_request is None else outward_fields(dict(plan_request)),
        "task_instances": None if task_states is None else _tally(task_states.values()),
        "splits": [dict(split) for split in splits],
    }


def _tally(states: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for state in states:
        name = outward_text(str(state or "none"))
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items()))


def _first(times: Any) -> str | None:
    found = [t for t in times if t is not None]
    return min(found).isoformat() if found else None


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
