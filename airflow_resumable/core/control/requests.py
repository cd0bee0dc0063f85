"""Requests a person (or a program) makes of a slot: pause, resume, cancel, restart, release.

Each request is one transaction: a conditional write on the slot's row per rule of the request, tried in
turn until one takes, and its record in the attempt history
naming who asked (``by``) and when. The condition is part of the write, so a
request never races the attempt running the slot: it applies to the row as it is at that moment,
or changes nothing and raises :class:`~airflow_resumable.core.model.errors.RequestRefused` saying why.

Which slot takes which request, what taking it writes and why a refused one is refused is one
table, :data:`airflow_resumable.core.model.request_rules.RULES` (with a comment per rule), rendered to each
write's SQL and evaluated here for the refusal's reason; ``airflow resumable pause --help`` (and
each other request's) prints its rules in words, and the docs' table says the same for users.

A request once taken is never dropped because its holder died: a pause or a cancel that the holder
did not live to see is honoured by the slot's next attempt before its first chunk; a resume or a
restart is what that next attempt does anyway; a release needs no holder.

This module is the core's (no Airflow); ``airflow_resumable.control`` is the same API by
connection id, and the CLI and the UI call that.
"""

from __future__ import annotations

import dataclasses
import getpass
import math
import re
import socket
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from airflow_resumable.core.model import request_rules as rules
from airflow_resumable.core.model.checkpoint import Checkpoint
from airflow_resumable.core.model.columns import to_datetime
from airflow_resumable.core.model.errors import (
    ConfigurationError,
    CorruptCheckpoint,
    OwnerChanged,
    RequestRefused,
    SlotNotFound,
)
from airflow_resumable.core.model.options import key_problem
from airflow_resumable.core.model.outward import outward_text, visible
from airflow_resumable.core.model.request_rules import ACTIONS, Action
from airflow_resumable.core.model.states import AttemptEnd, Request, Status
from airflow_resumable.core.stores.base import Store, StoreSession
from airflow_resumable.core.stores.shared_sql import ANY_OWNER
from airflow_resumable.core.view import Liveness, cut_value, job_line, liveness_of
from airflow_resumable.core.work import rebalance
from airflow_resumable.core.work.partitions import (
    PLAN_SUFFIX,
    Plan,
    load_plan,
    outside_plan,
    partition_job,
    plan_job,
    range_index,
)

__all__ = ["ACTIONS", "COUNTS", "OUTCOMES", "PARTITION_KINDS", "TaskStates", "apply", "base_job", "cancel", "check_keys", "default_by", "job_partitions", "jobs",
           "pause", "range_view", "record_rerun", "release", "restart", "resume", "stale", "wake"]

#: How Airflow's task instances of a job's run stand, given its DAG, task and run: ``{map_index:
#: state}`` (-1: unmapped), or None when not known. The Airflow layer gives it; the core has no Airflow.
TaskStates = Callable[[str | None, str | None, str | None], Mapping[int, str] | None]

#: The longest ``by`` kept.
MAX_BY = 200


def default_by() -> str:
    """Who asks, when the caller does not say: ``user@host`` of this process."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (a container without one)
        user = "unknown"
    return visible(f"{user}@{socket.gethostname()}")


def pause(store: Store, job: str, slot: str, *, by: str | None = None) -> Checkpoint:
    """Ask the slot's run to pause at its next chunk boundary. See the module's table.

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: the slot is done or paused, or a pause or a restart is pending; nothing changed.
    """
    return _request(store, job, slot, Action.PAUSE, by)


def resume(store: Store, job: str, slot: str, *, by: str | None = None) -> Checkpoint:
    """Let a paused slot continue from its checkpoint (or withdraw a pending pause).

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: the slot is not paused and no pause is pending; nothing changed.
    """
    return _request(store, job, slot, Action.RESUME, by)


def cancel(store: Store, job: str, slot: str, *, by: str | None = None) -> Checkpoint:
    """Stop the slot's run for good (reason ``requested``): its task fails without a retry. The
    checkpoint is kept: a Clear of the task resumes from it.

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: the slot is done, failed or cancelled (nothing runs); nothing changed.
    """
    return _request(store, job, slot, Action.CANCEL, by)


def restart(store: Store, job: str, slot: str, *, by: str | None = None) -> Checkpoint:
    """Make the slot's next attempt start from the beginning (its checkpoint is discarded then,
    not now). A paused slot continues at once, from the beginning; for any other, Clear its task
    in Airflow (or wait for its retry) to run it.

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: a live attempt runs the slot (pause or cancel it first), or a restart is
            already pending; nothing changed.
    """
    return _request(store, job, slot, Action.RESTART, by)


def release(store: Store, job: str, slot: str, *, by: str | None = None, force: bool = False) -> Checkpoint:
    """Free the lease of a holder that died, so that the next attempt takes the slot at once
    instead of waiting for the lease to lapse. With ``force``, also a live holder's: it is fenced
    out (its next checkpoint or heartbeat fails as ``lease_lost``).

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: nobody holds the lease, or the holder is alive and ``force`` is not set;
            nothing changed.
    """
    return _request(store, job, slot, Action.RELEASE, by, force=force)


#: What each request records in the slot's history.
OUTCOMES = {Action.PAUSE: AttemptEnd.PAUSE_REQUESTED, Action.RESUME: AttemptEnd.RESUME_REQUESTED,
            Action.CANCEL: AttemptEnd.CANCEL_REQUESTED, Action.RESTART: AttemptEnd.RESTART_REQUESTED,
            Action.RELEASE: AttemptEnd.LEASE_RELEASED}


def _request(store: Store, job: str, slot: str, action: Action, by: str | None, *, force: bool = False) -> Checkpoint:
    """Apply ``action``; raise saying why when the row does not take it."""
    with store.open(autocommit=True) as session:
        session.ensure_schema()
        return apply(session, job, slot, action, by=by, force=force)


def apply(session: StoreSession, job: str, slot: str, action: Action, *, by: str | None = None,
          force: bool = False, dag_id: Any = ANY_OWNER) -> Checkpoint:
    """Apply ``action`` to the slot in ``session`` (its schema checked by the caller): one
    conditional write and its history record, in one transaction. Returns the row after it.
    ``dag_id``, when given (None: a row that names no DAG), is the owning DAG the caller was
    authorized for: the write takes the slot only while its row still names it.

    Raises:
        ConfigurationError: the job, the slot or ``by`` is not a valid one.
        SlotNotFound / RequestRefused: as each request says (a partition past its job's current plan
            takes none, naming the plan); nothing changed.
        OwnerChanged: the row names another DAG than ``dag_id`` now; nothing changed.
    """
    by = _by(by, job=job, slot=slot)
    check_keys(job, slot)
    with session.transaction():  # the plan checked is the plan written under: a replan waits for the write
        held_in_plan(session, slot, job)
        row = session.requests.apply(job, slot, action, by=by, outcome=OUTCOMES[action], force=force, dag_id=dag_id)
    if row is None:
        raise _refused(session, job, slot, action, force=force, dag_id=dag_id)
    return row


def held_in_plan(session: StoreSession, slot: str, *jobs: str) -> None:
    """Inside a transaction: hold the plan of each partition among ``jobs`` (``<job>[i]``, or a range a
    split took, ``<job>[i].n``), once per
    job it belongs to, so that a split anew waits until the transaction ends, then refuse any of
    ``jobs`` that is a partition past its job's current plan: nothing would run it, so no request
    is written there, whoever asks. The one check every request and re-run makes before its write.

    Raises:
        RequestRefused: naming the plan (:func:`~airflow_resumable.core.work.partitions.outside_plan`).
    """
    for partitioned in dict.fromkeys(p[0] for job in jobs if (p := range_index(job)) is not None):
        session.plans.hold(partitioned, slot)
    for job in jobs:
        outside = outside_plan(session.checkpoints.load, job, slot)
        if outside is not None:
            raise outside


def not_found(job: str, slot: str) -> SlotNotFound:
    """The error for a slot the checkpoint table does not have."""
    return SlotNotFound(
        "no checkpoint row for this slot", job=job, slot=slot,
        hint="A slot's row appears when its task first runs; check the job (default <dag_id>.<task_id>, "
        "plus [map_index] when mapped) and the slot (the run's data interval start, ISO 8601)",
    )


def wake(row: Checkpoint | None, *, until: datetime | None, now: datetime) -> dict[str, str] | None:
    """What a paused run waits for, read off its row: None to go on waiting, else the event that
    ends the wait (``{"event": "resumed" | "cancelled" | "missing", "why": ...}``).

    The run continues when a resume or a restart is requested, when its time comes (a throttle's
    or a time slice's ``until``), or when the slot is no longer paused (a Clear ran it meanwhile);
    it ends when the slot is cancelled (or a cancel is pending) or its row is gone.
    """
    if row is None:
        return {"event": "missing", "why": "the slot's checkpoint row was deleted while it was paused"}
    found = _woken(row, until=until, now=now)
    # The why is logged by the task and may end it: its texts (who asked, an error) as they may go out.
    return None if found is None else {**found, "why": outward_text(found["why"])}


def _woken(row: Checkpoint, *, until: datetime | None, now: datetime) -> dict[str, str] | None:
    by = row.requested_by or "?"
    if row.status == Status.CANCELLED:
        return {"event": "cancelled", "why": f"{row.last_error or 'cancelled'} while paused"}
    if row.cancel_request:
        return {"event": "cancelled", "why": f"cancelled ({row.cancel_request}) by {by} while paused"}
    if row.status != Status.PAUSED:
        return {"event": "resumed", "why": f"the slot is {row.status} now"}
    if row.request in (Request.RESUME, Request.RESTART):
        return {"event": "resumed", "why": f"{row.request} requested by {by}"}
    if until is not None and now >= until:
        return {"event": "resumed", "why": f"{row.stop_reason or 'pause'} over"}
    return None


def checked_by(by: str, *, job: str | None = None, slot: str | None = None) -> str:
    """``by`` as a request of ``job``'s ``slot`` records it (stripped, at most :data:`MAX_BY` characters).

    Raises:
        ConfigurationError: it is not a non-empty string, holds what the history cannot (a NUL
            character, text that is not UTF-8), or holds a control character (an escape sequence, a
            line break, a tab, a bidirectional override): who asks is printed by ``airflow resumable
            history`` and ``show``, where it would reach a terminal. Nothing was read or changed.
    """
    return _by(by, job=job, slot=slot)


def _by(by: str | None, *, job: str | None = None, slot: str | None = None) -> str:
    if by is None:
        return default_by()
    if not isinstance(by, str) or not by.strip():
        raise ConfigurationError(f"by must name who asks (a non-empty string), got {by!r}", job=job, slot=slot,
                                 hint="Name who asks in plain text, e.g. --by alice@example.com")
    by = by.strip()[:MAX_BY]
    # What the history's text column cannot hold (PostgreSQL refused a NUL with its own error);
    # the length is not a problem: it is cut.
    problem = key_problem("by", by)
    if problem is not None:
        raise ConfigurationError(problem, job=job, slot=slot, hint="Name who asks in plain text")
    if by != visible(by) or "\n" in by or "\t" in by:  # kept in the history, printed to terminals and pages
        shown = visible(by).replace("\n", "\\n").replace("\t", "\\t")
        raise ConfigurationError(
            f"by '{shown}' holds a control character (an escape sequence, a line break, a tab or a "
            "bidirectional override): who asks goes to the slot's history, which `airflow resumable history` "
            "and `show` print to a terminal; nothing was changed", job=job, slot=slot,
            hint="Name who asks in plain text (letters, digits, spaces, @ . - _), e.g. --by alice@example.com")
    return by


def check_keys(job: str, slot: str, *, size: bool = True) -> None:
    """Refuse a job or a slot the checkpoint table cannot hold, before any query; without ``size``,
    only one no query can carry (a lookup of a name too long to be stored finds no slot).

    Raises:
        ConfigurationError: saying what is wrong with it (a NUL, not UTF-8, empty; too long).
    """
    problems = [p for p in (key_problem("job", job, size=size), key_problem("slot", slot, size=size)) if p]
    if problems:
        raise ConfigurationError("; ".join(problems), hint="Name the slot as the checkpoint table does")


def _refused(session: StoreSession, job: str, slot: str, action: Action, *, force: bool,
             dag_id: Any = ANY_OWNER) -> Exception:
    """Why the row did not take ``action``, read after the refused write (which changed nothing):
    the refusal the rules give for the row as it is now, or that it names another owning DAG than
    the caller's ``dag_id``."""
    row = session.checkpoints.load(job, slot)
    if row is None:
        return not_found(job, slot)
    if dag_id is not ANY_OWNER and row.dag_id != dag_id:
        return OwnerChanged(job=job, slot=slot)
    found = rules.decide(action, rules.slot_of(row, _now(row)), force=force)
    if isinstance(found, rules.Rule):  # the row changed since the write (its lease lapsed, a holder ended)
        found = rules.OTHERWISE
    message, hint = rules.refusal_text(found, action, row)
    return RequestRefused(message, status=row.status, job=job, slot=slot, hint=hint)


def stale(row: Checkpoint) -> bool:
    """Whether the holder missed two heartbeats (it renews every lease/3): taken for dead."""
    return rules.missed_heartbeats(row, _now(row))


def now_of(row: Checkpoint) -> datetime:
    """Now, in the time zone of ``row``'s lease times (what the rules compare them with)."""
    return _now(row)


def _now(row: Checkpoint) -> datetime:
    expires = row.lease_expires_at
    return datetime.now(tz=expires.tzinfo if expires is not None and expires.tzinfo else timezone.utc)


# -- per-job summary ------------------------------------------------------------------------------

#: How a partition's status counts in its job's summary: ``done``; ``failed`` (it ended without
#: finishing: failed or cancelled, what a Clear resumes, and what ``tolerated_failure`` counts);
#: ``running`` (then ``stalled`` or ``abandoned`` instead when its row is shown so, by
#: :func:`~airflow_resumable.core.view.liveness_of`); ``paused``. A partition of the plan that has no
#: row yet counts as ``waiting`` (its task instance has not started), anything else as ``other``.
PARTITION_KINDS = {Status.DONE: "done", Status.FAILED: "failed", Status.CANCELLED: "failed",
                   Status.RUNNING: "running", Status.PAUSED: "paused"}
_STATUSES = frozenset(s.value for s in Status)
#: The counts of a job's line, in the order they are shown.
COUNTS = ("done", "running", "stalled", "abandoned", "paused", "failed", "waiting", "other")

#: ``[map_index]``, or ``[i].n`` (a range rebalancing took from partition ``i``: run by another
#: partition's task instance, so its map index is that one's).
_MAP_SUFFIX = re.compile(r"\[\d+\](?:\.\d+)?$")


def base_job(job: str, map_index: int | None) -> str:
    """A mapped partition's job without its ``[map_index]`` (or a range a split took, without its
    ``[i].n``): the job a person names."""
    return _MAP_SUFFIX.sub("", job) if _summed(map_index, -1) >= 0 else job


def _summed(value: Any, otherwise: int = 0) -> int | float | Decimal:
    """A number the listing's SQL gave (a sum, a largest map index), for a line; ``otherwise`` for
    what a row holds only when edited by hand (SQLite keeps text, infinity or NaN in a number
    column): such a row's group (its run and status, summed by SQL) counts nothing for that number,
    and the jobs list stays readable."""
    if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool) and math.isfinite(value):
        return value  # (PostgreSQL sums a BIGINT as a NUMERIC: a Decimal)
    return otherwise


@dataclasses.dataclass
class _Run:
    """One run of one job, added up from the listing's groups (one group per status)."""

    name: str
    dag_id: str | None
    task_id: str | None
    run_id: str | None
    slot: str
    counts: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    updated: datetime | None = None
    mapped: bool = False
    last_index: int = -1
    processed: int = 0
    total: int = 0
    totals: int = 0
    rate: float = 0.0
    planned: int | None = None
    planned_rows: int | None = None
    skipped: int = 0
    #: A request pending on the plan row (a restart of the whole job), with who asked: carried out
    #: by the planning task's next run, or refused there while a partition runs.
    plan_request: dict[str, Any] | None = None
    #: How each of its running rows is shown (:func:`~airflow_resumable.core.view.liveness_of`).
    running: list[Liveness] = dataclasses.field(default_factory=list)
    #: Its run's task instances in Airflow, ``{map_index: state}``, when the caller knows them.
    task_states: Mapping[int, str] | None = None
    #: The running rows that stand for their partition's line (the others' rates count, not their
    #: status: a line with ranges taken from it is counted once, :func:`_fold_lines`).
    recount: list[Liveness] = dataclasses.field(default_factory=list)
    #: The jobs of the ranges splits took (``<job>[i].n``) that the current plan holds.
    taken: set[str] = dataclasses.field(default_factory=set)
    #: The jobs whose running row does not stand for its line (another range of the line does).
    uncounted: set[str] = dataclasses.field(default_factory=set)
    #: A range taken by a split has no row or no total yet: the lines' totals are not all known.
    unknown_totals: bool = False
    #: The plan's splits as the line shows them (:func:`_fold_lines`), in the order they were agreed,
    #: and each by the job of the range it took.
    splits: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    split_of: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def add(self, status: str, count: int, updated: Any, map_index: int | None, processed: Any, total: Any,
            totals: Any, rate: Any) -> None:
        self.counts[PARTITION_KINDS.get(Status(status), "other") if status in _STATUSES else "other"] += int(count)
        index = int(_summed(map_index, -1))
        self.mapped = self.mapped or index >= 0
        self.last_index = max(self.last_index, index)
        try:
            when = to_datetime(updated)
        except (TypeError, ValueError, OverflowError, OSError):  # SQLite: a time edited by hand into text
            when = None
        if when is not None and (self.updated is None or when > self.updated):
            self.updated = when
        self.processed += int(_summed(processed))
        self.total += int(_summed(total))
        self.totals += int(_summed(totals))
        self.rate += float(_summed(rate))

    @property
    def seen(self) -> int:
        return sum(self.counts.values())

    def line(self) -> dict[str, Any]:
        """The job's line: its partitions counted, and its progress as the sum of theirs
        (:func:`~airflow_resumable.core.view.job_line` shapes it)."""
        counts = dict(self.counts)
        if self.planned is not None:
            counts["waiting"] = max(0, self.planned - self.seen)
        for shown in self.recount:  # a running or paused row counts as it is shown
            if shown.shown != shown.stored and shown.shown in counts and counts.get(shown.stored, 0) > 0:
                counts[shown.stored] -= 1
                counts[shown.shown] += 1
        return job_line(job=self.name, dag_id=self.dag_id, task_id=self.task_id, run_id=self.run_id, slot=self.slot,
                        mapped=self.mapped, partitioned=self.planned is not None, counts=counts,
                        processed=self.processed, totals_known=self.totals == self.seen and not self.unknown_totals,
                        total=self.total, planned_rows=self.planned_rows, skipped=self.skipped, running=self.running,
                        updated=self.updated, plan_request=self.plan_request, task_states=self.task_states,
                        splits=self.splits)

    def live(self) -> bool:
        """Whether a row of it is running or paused (a line's, or a taken range's behind a line that
        stands otherwise)."""
        return bool(self.counts["running"] or self.counts["paused"]
                    or any(s["status"] in (Status.RUNNING.value, Status.PAUSED.value) for s in self.splits))


def _runs(session: StoreSession, groups: list[tuple[Any, ...]], *, dag_ids: Collection[str] | None = None,
          job: str | None = None, only_run: str | None = None, task_states: TaskStates | None = None) -> list[_Run]:
    """Each job's latest run (or, with ``job``, that job's runs only), most recently updated first;
    a partitioned job's ``<job>#plan`` row folded into its job (the plan's partitions that have not
    started count as ``waiting``), never a job of its own. ``only_run``: the DAG run ``groups`` were
    read for, if one."""
    plans: dict[tuple[str, str], bool] = {}
    runs: dict[tuple[str, str], _Run] = {}
    for dag_id, task_id, run_id, status, name, count, updated, map_index, slot, processed, total, totals, rate in groups:
        if name.endswith(PLAN_SUFFIX):
            plans[(name[:-len(PLAN_SUFFIX)], slot)] = True
            continue
        if dag_ids is not None and dag_id not in dag_ids:
            continue
        base = base_job(name, map_index)
        if job is not None and base != job and name != job:
            continue
        run = runs.get((base, slot))
        if run is None:
            run = runs[(base, slot)] = _Run(base, dag_id, task_id, run_id, slot)
        run.dag_id, run.task_id, run.run_id = run.dag_id or dag_id, run.task_id or task_id, run.run_id or run_id
        run.add(status, count, updated, map_index, processed, total, totals, rate)
    latest: dict[str, _Run] = {}
    floor = datetime.min.replace(tzinfo=timezone.utc)
    for run in runs.values():
        held = latest.get(run.name)
        if job is not None or held is None or (run.updated or floor) > (held.updated or floor):
            latest[run.name if job is None else f"{run.name}\0{run.slot}"] = run
    chosen = sorted(latest.values(), key=lambda r: r.updated or floor, reverse=True)
    pending = session.skips.pending() if chosen else {}
    for run in chosen:
        if (run.name, run.slot) in plans:
            _fold_plan(session, run, dag_ids=dag_ids, run_id=only_run)
            run.plan_request = _plan_request(session, run.name, run.slot)
        run.skipped = _skipped(run, pending)
        if task_states is not None:
            run.task_states = task_states(run.dag_id, run.task_id, run.run_id)
        if run.live():
            _running(session, run, dag_ids=dag_ids, run_id=only_run)
    return chosen


def _index(map_index: int | None) -> int:
    return -1 if map_index is None else int(map_index)


def _running(session: StoreSession, run: _Run, *, dag_ids: Collection[str] | None, run_id: str | None) -> None:
    """How each running or paused row of ``run`` is shown now: by the rule each one's own detail is
    shown with (:func:`~airflow_resumable.core.view.liveness_of`), so that the line and the slots agree
    (``run.running``; ``run.recount``: those that stand for their partition's line). The rows of
    partitions past the plan are left out, as :func:`_fold_plan` takes them out, and so are those of
    ranges taken by splits the plan does not hold. A taken range is judged by the task instance that
    runs it (its row's map index)."""
    run.running, run.recount = [], []
    by_job = run.split_of
    for row in session.listings.live(run.slot):
        if (dag_ids is not None and row.dag_id not in dag_ids) or (run_id is not None and row.run_id != run_id):
            continue
        if base_job(row.job, row.map_index) != run.name and row.job != run.name:
            continue
        found = range_index(row.job)
        if run.planned is not None and found is not None and found[2] is not None:
            if row.job not in run.taken:
                continue
        elif run.planned is not None and row.job != run.name and (row.map_index or 0) >= run.planned:
            continue
        ti_state = None if run.task_states is None else run.task_states.get(_index(row.map_index))
        shown = liveness_of(row, _now(row), ti_state=ti_state)
        run.running.append(shown)
        if row.job not in run.uncounted:
            run.recount.append(shown)
        if row.job in by_job:
            by_job[row.job]["shown_status"] = shown.shown


def _skipped(run: _Run, pending: dict[tuple[str, str], int]) -> int:
    """The dead letters of ``run``'s partitions not replayed (``pending``: as
    :meth:`~airflow_resumable.core.stores.skips.Skips.pending` counts them). A partition past
    the plan (a split anew into fewer left its row) counts for nothing, its dead letters neither."""
    out = 0
    for (name, slot), n in pending.items():
        found = range_index(name)
        if slot != run.slot or (name != run.name and (found is None or found[0] != run.name)):
            continue
        if name == run.name or run.planned is None or found is None:
            out += n
        elif found[1] < run.planned and (found[2] is None or name in run.taken):  # a range of the plan's lines
            out += n
    return out


def _fold_plan(session: StoreSession, run: _Run, *, dag_ids: Collection[str] | None, run_id: str | None) -> None:
    """Fold the slot's plan into ``run``: its partitions and rows. Partitions past the plan (rows of
    an earlier split into more partitions, left by a restart of the plan that split anew into
    fewer) are no partition of this plan: their rows stay in the table with their history, and are
    taken out of the run's line as they were added to it (``dag_ids`` and ``run_id``: the filters
    the line was added up with)."""
    plan = _readable_plan(session, run.name, run.slot)
    if plan is None:
        return
    run.planned, run.planned_rows = plan.partitions, plan.rows
    if not plan.splits and run.last_index < plan.partitions and run.seen <= plan.partitions:
        return
    current = plan.current()
    for dag_id, _task, _run, status, name, count, _u, map_index, _s, processed, total, totals, rate in (
            session.listings.partitions(run_id=run_id, slot=run.slot, partitions_of=run.name)):
        found = range_index(name)
        if (dag_ids is not None and dag_id not in dag_ids) or base_job(name, map_index) != run.name \
                or found is None or found[0] != run.name:
            continue
        _base, index, number = found
        canonical = partition_job(run.name, index) + ("" if number is None else f".{number}")
        if name != canonical or (number is None and index < plan.partitions):
            continue
        if number is not None and index < plan.partitions and f"{index}.{number}" in current:
            # A range a split took: part of its partition's line (counted there, :func:`_fold_lines`),
            # its items and its total added to the job's, its rate too.
            run.add(status, -int(count), None, None, 0, 0, -(totals or 0), 0.0)
            run.taken.add(name)
            continue
        run.add(status, -int(count), None, None, -(processed or 0), -(total or 0), -(totals or 0), -(rate or 0.0))
    run.last_index = plan.partitions - 1
    if plan.splits:
        _fold_lines(session, run, plan, dag_ids=dag_ids, run_id=run_id)


def _load(session: StoreSession, job: str, slot: str) -> Checkpoint | None:
    try:
        return session.checkpoints.load(job, slot)
    except CorruptCheckpoint:  # edited by hand: shown as not there (its own detail says what is wrong)
        return None


def _fold_lines(session: StoreSession, run: _Run, plan: Plan, *, dag_ids: Collection[str] | None,
                run_id: str | None) -> None:
    """Count each partition that ranges were taken from once, as its line stands
    (:func:`~airflow_resumable.core.work.rebalance.line_row`, as the summary task counts it): ``done``
    when every range of the line is, else as the first range that is not (a taken range nobody
    started: ``failed``); and list the splits (``run.splits``): which range took what from whom, when,
    and who runs it now, how it stands and how far it got."""
    current = plan.current()
    rows: dict[str, Checkpoint | None] = {}
    for index in range(plan.partitions):
        jobs = rebalance.line_jobs(run.name, plan, index)
        if len(jobs) < 2:
            continue
        line = [_load(session, job, run.slot) for job in jobs]
        rows.update(zip(jobs, line, strict=True))
        own = line[0]
        if own is None:
            continue
        if any(r is None or r.total is None for r in line[1:]):
            run.unknown_totals = True
        whole = rebalance.line_row(line, jobs)
        assert whole is not None
        counted = (dag_ids is None or own.dag_id in dag_ids) and (run_id is None or own.run_id == run_id)
        if counted and whole.status != own.status:
            run.counts[_kind(own.status)] -= 1
            run.counts[_kind(whole.status)] += 1
        # the range the line stands as (the first one not done) is the one whose liveness counts
        standing = next((job for job, r in zip(jobs, line, strict=True)
                         if r is None or r.status != Status.DONE.value), None)
        run.uncounted.update(job for job in jobs if job != standing)
    for rng in current.values():
        job = rng.job(run.name)
        if rng.split is not None and job not in rows:
            rows[job] = _load(session, job, run.slot)
    for split in rebalance.split_records(run.name, plan, rows):
        view = outward_split(split)
        view["shown_status"] = view["status"]  # a live one's as it is shown, by _running
        run.split_of[split["job"]] = view
        run.splits.append(view)


def outward_split(split: dict[str, Any]) -> dict[str, Any]:
    """A split of :func:`~airflow_resumable.core.work.rebalance.split_records` as it may leave the
    process: its texts through ``outward_text``, its keys cut as every position is (``cut_value``)."""
    return {**split, **{k: None if split[k] is None else outward_text(str(split[k]))
                        for k in ("job", "from", "by", "when", "status")},
            "after": cut_value(split["after"])[0], "until": cut_value(split["until"])[0]}


def range_view(session: StoreSession, job: str, slot: str) -> dict[str, Any] | None:
    """Where rebalancing put the slot of ``job`` (a slot's detail: ``show``, ``GET .../checkpoint``):
    for a range a split took (``<job>[i].n``), that split (which range it came from, the keys it
    holds now, who asked, when); for a partition ranges were taken from (``<job>[i]``), the keys it
    holds now and the jobs of the ranges taken from its line (``taken``). None: neither, or no
    readable plan."""
    found = range_index(job)
    if found is None:
        return None
    base, index, number = found
    plan = _readable_plan(session, base, slot)
    if plan is None or not plan.splits or index >= plan.partitions:
        return None
    current = plan.current()
    if number is None:
        jobs = rebalance.line_jobs(base, plan, index)
        own = current[str(index)]
        return None if len(jobs) < 2 else {
            "range": own.name, "after": cut_value(own.after)[0], "until": cut_value(own.until)[0],
            "taken": [outward_text(j) for j in jobs[1:]]}
    splits = [split for split in rebalance.split_records(base, plan, {}) if split["range"] == f"{index}.{number}"]
    if not splits:
        return None
    return {k: v for k, v in outward_split(splits[0]).items() if k not in ("status", "map_index", "processed", "total")}


def _kind(status: Any) -> str:
    return PARTITION_KINDS.get(Status(status), "other") if status in _STATUSES else "other"


def _plan_request(session: StoreSession, job: str, slot: str) -> dict[str, Any] | None:
    """The request pending on the job's plan row for ``slot`` (``request``, ``requested_by``), or None."""
    try:
        row = session.checkpoints.load(plan_job(job), slot)
    except CorruptCheckpoint:  # edited by hand: the listing shows the job without its plan (see _readable_plan)
        return None
    if row is None or row.request is None:
        return None
    return {"request": str(row.request), "requested_by": row.requested_by}


def _readable_plan(session: StoreSession, job: str, slot: str) -> Any:
    """The slot's plan, or None when there is none or its row does not hold one (changed by hand, even
    into text that is not JSON: the planning task refuses it, saying so; a listing shows the job
    without it, and every other job as it is)."""
    try:
        return load_plan(session, job, slot)
    except (ConfigurationError, CorruptCheckpoint):
        return None


def jobs(store: Store, *, dag_ids: Collection[str] | None = None,
         task_states: TaskStates | None = None) -> list[dict[str, Any]]:
    """One line per job (per DAG and task): its latest run's partitions counted by how they stand
    (:data:`PARTITION_KINDS`), and its progress as the sum of theirs (``processed``, ``total``,
    ``percent``; ``rate``: the sum of the live partitions' rates, each as its attempt measured it;
    ``eta_seconds`` from them, :func:`~airflow_resumable.core.view.eta_of`), most recently
    updated first. An unmapped task is a job of one partition. Only the jobs of ``dag_ids`` when
    given. With ``task_states``, a running partition whose task instance ended counts as
    ``abandoned``, and each line says how its run's task instances stand (``task_instances``)."""
    with store.open(autocommit=True) as session:
        session.ensure_schema()
        return [run.line() for run in _runs(session, session.listings.partitions(), dag_ids=dag_ids,
                                            task_states=task_states)]


def job_partitions(store: Store, job: str, run_id: str | None = None, *,
                   check: Callable[[str | None], None] | None = None, task_states: TaskStates | None = None,
                   ) -> tuple[dict[str, Any], list[tuple[int, Checkpoint | None]]]:
    """One job's line (as :func:`jobs` gives it) for ``run_id`` (default: its latest run), and
    each partition's row by map index (None: a partition of the plan that has not started; an
    unmapped job has one, index -1). ``check(dag_id)``, if given, is called with the DAG that ran
    the job before any partition's row is read (a permission check: what it raises goes out, and
    nothing a row holds, not even a corrupt row's error, reaches a caller it refused).

    Raises:
        SlotNotFound: no partition of the job ran (in that run).
    """
    with store.open(autocommit=True) as session:
        session.ensure_schema()
        runs = _runs(session, session.listings.partitions(run_id=run_id), job=job, only_run=run_id,
                     task_states=task_states)
        if not runs:
            raise SlotNotFound("no partition of this job ran" + (" in this DAG run" if run_id else ""), job=job,
                               slot=run_id, hint="Name the job as `airflow resumable jobs` lists it (without "
                               "[map_index]), with the run id it shows")
        run = runs[0]
        if check is not None:
            check(run.dag_id)
        if run.mapped and run.planned is None:  # the plan row names no run: found by its slot
            _fold_plan(session, run, dag_ids=None, run_id=run_id)
            if run.planned is not None:
                run.skipped = _skipped(run, session.skips.pending(run.slot))
            if run.planned is not None and run.live():  # past the plan: left out
                _running(session, run, dag_ids=None, run_id=run_id)
        if not run.mapped:
            return run.line(), [(-1, session.checkpoints.load(run.name, run.slot))]
        count = max(run.last_index + 1, run.planned or 0)
        return run.line(), [(i, session.checkpoints.load(partition_job(run.name, i), run.slot)) for i in range(count)]


def record_rerun(store: Store, job: str, run_id: str, map_indexes: Collection[int], *, by: str) -> int:
    """Record in each partition's history (``map_indexes`` of ``job`` in ``run_id``; -1: the
    unmapped job's slot) that a re-run of it was asked, by whom: one record each, as a request's
    (outcome ``rerun_requested``). Returns how many slots it recorded on (a partition with no row
    has no history).

    Raises:
        RequestRefused: a partition past its job's current plan (nothing runs it again), naming the
            plan; nothing was recorded. The plan is held while the partitions are checked and the
            records written, as for a request (a split anew waits for them).
    """
    by = _by(by, job=job, slot=run_id)
    with store.open(autocommit=True) as session:
        session.ensure_schema()
        slots = {slot for _d, _t, _r, _s, name, _c, _u, index, slot, *_ in session.listings.partitions(run_id=run_id)
                 if base_job(name, index) == job or name == job}
        names = [job if index < 0 else partition_job(job, index) for index in map_indexes]
        with session.transaction():  # the plan checked is the plan recorded under
            for slot in sorted(slots):
                held_in_plan(session, slot, *names)
            rows = [row for slot in sorted(slots) for name in names
                    if (row := session.checkpoints.load(name, slot)) is not None]
            return session.requests.record_reruns(rows, by=by)
