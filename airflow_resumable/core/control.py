"""Requests a person (or a program) makes of a slot: pause, resume, cancel, restart, release.

Each request is one transaction: a conditional write on the slot's row per rule of the request, tried in
turn until one takes, and its record in the attempt history
naming who asked (``by``) and when. The condition is part of the write, so a
request never races the attempt running the slot: it applies to the row as it is at that moment,
or changes nothing and raises :class:`~airflow_resumable.core.errors.RequestRefused` saying why.

Which slot takes which request, what taking it writes and why a refused one is refused is one
table, :data:`airflow_resumable.core.rules.RULES` (with a comment per rule), rendered to each
write's SQL and evaluated here for the refusal's reason; ``airflow resumable pause --help`` (and
each other request's) prints its rules in words, and the docs' table says the same for users.

A request once taken is never dropped because its holder died: a pause or a cancel that the holder
did not live to see is honoured by the slot's next attempt before its first chunk; a resume or a
restart is what that next attempt does anyway; a release needs no holder.

This module is the core's (no Airflow); ``airflow_resumable.control`` is the same API by
connection id, and the CLI and the UI call that.
"""

from __future__ import annotations

import getpass
import socket
from datetime import datetime, timezone

from airflow_resumable.core import rules
from airflow_resumable.core.checkpoint import Checkpoint
from airflow_resumable.core.errors import ConfigurationError, RequestRefused, SlotNotFound
from airflow_resumable.core.options import key_problem
from airflow_resumable.core.rules import ACTIONS, Action
from airflow_resumable.core.states import AttemptEnd, Request, Status
from airflow_resumable.core.stores.base import Store, StoreSession

__all__ = ["ACTIONS", "cancel", "default_by", "pause", "release", "restart", "resume", "stale", "wake"]

#: The longest ``by`` kept.
MAX_BY = 200


def default_by() -> str:
    """Who asks, when the caller does not say: ``user@host`` of this process."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (a container without one)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def pause(store: Store, job: str, slot: str, *, by: str | None = None) -> Checkpoint:
    """Ask the slot's run to pause at its next chunk boundary. See the module's table.

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: the slot is done or paused, or a pause or a restart is pending; nothing changed.
    """
    return _request(store, job, slot, Action.PAUSE, AttemptEnd.PAUSE_REQUESTED, by)


def resume(store: Store, job: str, slot: str, *, by: str | None = None) -> Checkpoint:
    """Let a paused slot continue from its checkpoint (or withdraw a pending pause).

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: the slot is not paused and no pause is pending; nothing changed.
    """
    return _request(store, job, slot, Action.RESUME, AttemptEnd.RESUME_REQUESTED, by)


def cancel(store: Store, job: str, slot: str, *, by: str | None = None) -> Checkpoint:
    """Stop the slot's run for good (reason ``requested``): its task fails without a retry. The
    checkpoint is kept: a Clear of the task resumes from it.

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: the slot is done, failed or cancelled (nothing runs); nothing changed.
    """
    return _request(store, job, slot, Action.CANCEL, AttemptEnd.CANCEL_REQUESTED, by)


def restart(store: Store, job: str, slot: str, *, by: str | None = None) -> Checkpoint:
    """Make the slot's next attempt start from the beginning (its checkpoint is discarded then,
    not now). A paused slot continues at once, from the beginning; for any other, Clear its task
    in Airflow (or wait for its retry) to run it.

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: a live attempt runs the slot (pause or cancel it first), or a restart is
            already pending; nothing changed.
    """
    return _request(store, job, slot, Action.RESTART, AttemptEnd.RESTART_REQUESTED, by)


def release(store: Store, job: str, slot: str, *, by: str | None = None, force: bool = False) -> Checkpoint:
    """Free the lease of a holder that died, so that the next attempt takes the slot at once
    instead of waiting for the lease to lapse. With ``force``, also a live holder's: it is fenced
    out (its next checkpoint or heartbeat fails as ``lease_lost``).

    Raises:
        SlotNotFound: no such slot.
        RequestRefused: nobody holds the lease, or the holder is alive and ``force`` is not set;
            nothing changed.
    """
    return _request(store, job, slot, Action.RELEASE, AttemptEnd.LEASE_RELEASED, by, force=force)


def _request(store: Store, job: str, slot: str, action: Action, outcome: AttemptEnd, by: str | None, *,
             force: bool = False) -> Checkpoint:
    """Apply ``action``; raise saying why when the row does not take it."""
    by = _by(by)
    _check_keys(job, slot)
    with store.open(autocommit=True) as session:
        session.ensure_schema()
        row = session.requests.apply(job, slot, action, by=by, outcome=outcome, force=force)
        if row is None:
            raise _refused(session, job, slot, action, force=force)
        return row


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


def _by(by: str | None) -> str:
    if by is None:
        return default_by()
    if not isinstance(by, str) or not by.strip():
        raise ConfigurationError(f"by must name who asks (a non-empty string), got {by!r}")
    return by.strip()[:MAX_BY]


def _check_keys(job: str, slot: str) -> None:
    problems = [p for p in (key_problem("job", job), key_problem("slot", slot)) if p]
    if problems:
        raise ConfigurationError("; ".join(problems), hint="Name the slot as the checkpoint table does")


def _refused(session: StoreSession, job: str, slot: str, action: Action, *, force: bool) -> Exception:
    """Why the row did not take ``action``, read after the refused write (which changed nothing):
    the refusal the rules give for the row as it is now."""
    row = session.checkpoints.load(job, slot)
    if row is None:
        return not_found(job, slot)
    found = rules.decide(action, rules.slot_of(row, _now(row)), force=force)
    if isinstance(found, rules.Rule):  # the row changed since the write (its lease lapsed, a holder ended)
        found = rules.OTHERWISE
    message, hint = rules.refusal_text(found, action, row)
    return RequestRefused(message, status=row.status, job=job, slot=slot, hint=hint)


def stale(row: Checkpoint) -> bool:
    """Whether the holder missed two heartbeats (it renews every lease/3): taken for dead."""
    return rules.missed_heartbeats(row, _now(row))


def _now(row: Checkpoint) -> datetime:
    expires = row.lease_expires_at
    return datetime.now(tz=expires.tzinfo if expires is not None and expires.tzinfo else timezone.utc)
