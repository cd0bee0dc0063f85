"""The life of a slot, in one table: its statuses, the moves between them, and how an attempt's
ending maps onto them.

A slot's row is created ``running`` by the first attempt that takes its lease. From there:

| from | to | when |
|---|---|---|
| (no row) | ``running`` | the first attempt starts |
| ``running`` | ``done`` / ``failed`` / ``cancelled`` | the attempt holding the lease ends |
| ``running`` | ``running`` | a new attempt takes over from one that died holding the slot |
| ``failed`` / ``cancelled`` | ``running`` | a retry or a Clear resumes (or a restart starts over) |
| ``done`` | ``running`` | only when someone asked for it (a Clear after success, a restart) |
| ``running`` | ``paused`` | the holder stopped at a chunk boundary for a pause, a throttle or a time slice |
| ``paused`` | ``running`` | resumed (a resume request, the throttle's or slice's time, a Clear) |
| ``paused`` | ``cancelled`` | cancelled while paused (nobody holds the lease) |

An attempt that **loses its lease** writes no status at all (the slot belongs to another attempt):
its only trace is its own history record. Losing the lease has one representation: the run's
signal with reason ``lease_lost``, raised by the lease keeper or by a rejected write, which
:meth:`~airflow_resumable.core.attempt.signal.Signal.raise_if_cancelled` turns into
:class:`~airflow_resumable.core.model.errors.LeaseLost`.
"""

from __future__ import annotations

import enum

from airflow_resumable.core.model.errors import CorruptCheckpoint


class Status(enum.StrEnum):
    """Where the slot's run stands. ``done`` is final until someone asks to run the slot again."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: Stopped at a chunk boundary to continue later (``stop_reason`` says why: ``paused``,
    #: ``throttled`` or ``time_slice``); holds no lease, and counts as live for the overlap policy.
    PAUSED = "paused"


class Action(enum.StrEnum):
    """A request a person (or a program) makes of a slot: what the CLI and the REST API accept.
    What each one does, status by status, is the rules table in :mod:`airflow_resumable.core.model.request_rules`."""

    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    RESTART = "restart"
    RELEASE = "release"


class Request(enum.StrEnum):
    """The actions that stay pending on the slot's row (column ``request``) until an attempt acts on
    them: a subset of :class:`Action`, by the same names (a cancel is pending in ``cancel_request``,
    with its reason; a release is carried out at once)."""

    PAUSE = Action.PAUSE.value  # the holder stops at its next chunk boundary (or the next attempt, at its start)
    RESUME = Action.RESUME.value  # a paused slot continues
    RESTART = Action.RESTART.value  # the next attempt starts over from the beginning


class AttemptEnd(enum.StrEnum):
    """How one attempt ended, as the attempt history records it."""

    # An attempt that ended in one of the slot's statuses records that status.
    RUNNING = Status.RUNNING.value  # not ended yet (or the process died: see the slot's lease)
    DONE = Status.DONE.value
    FAILED = Status.FAILED.value
    CANCELLED = Status.CANCELLED.value
    LEASE_LOST = "lease_lost"
    SKIPPED = "skipped"  # the overlap policy kept it from starting
    ALREADY_DONE = "already_done"  # the slot had finished: the stored outcome was returned
    PAUSED = Status.PAUSED.value  # stopped at a chunk boundary; the same try continues when resumed
    # Requests made through the control API: one record each, with who asked (requested_by).
    PAUSE_REQUESTED = f"{Action.PAUSE}_requested"
    RESUME_REQUESTED = f"{Action.RESUME}_requested"
    CANCEL_REQUESTED = f"{Action.CANCEL}_requested"
    RESTART_REQUESTED = f"{Action.RESTART}_requested"
    LEASE_RELEASED = f"lease_{Action.RELEASE}d"
    #: A retry of the slot's skipped items, which its next attempt replays (``core/attempt/skip_policy.py``).
    RETRY_SKIPPED_REQUESTED = "retry_skipped_requested"
    #: That retry withdrawn before a run carried it out: the items are ``skipped`` again.
    RETRY_SKIPPED_WITHDRAWN = "retry_skipped_withdrawn"
    #: A Clear of the slot's failed task instance asked through ``rerun_failed`` (``core/control/requests.py``).
    RERUN_REQUESTED = "rerun_requested"


#: The statuses a slot rests in once an attempt ended it: what retention (``clean``) may remove,
#: and then only when no attempt holds the slot's lease, and where the UI stops watching a slot
#: (``core/view.py``). ``running`` and ``paused`` (and any status a later release adds) are never
#: removed.
FINISHED: frozenset[Status] = frozenset({Status.DONE, Status.FAILED, Status.CANCELLED})

#: status -> the statuses a write may move it to (None: no row yet).
TRANSITIONS: dict[Status | None, frozenset[Status]] = {
    None: frozenset({Status.RUNNING}),
    Status.RUNNING: frozenset({Status.RUNNING, Status.DONE, Status.FAILED, Status.CANCELLED, Status.PAUSED}),
    Status.FAILED: frozenset({Status.RUNNING}),
    Status.CANCELLED: frozenset({Status.RUNNING}),
    Status.DONE: frozenset({Status.RUNNING}),
    Status.PAUSED: frozenset({Status.RUNNING, Status.CANCELLED}),
}

#: How an attempt's ending shows on the slot: the status it writes, or None when it writes none
#: (the lease is another attempt's, or nothing was started).
SLOT_STATUS: dict[AttemptEnd, Status | None] = {
    AttemptEnd.DONE: Status.DONE,
    AttemptEnd.FAILED: Status.FAILED,
    AttemptEnd.CANCELLED: Status.CANCELLED,
    AttemptEnd.LEASE_LOST: None,
    AttemptEnd.SKIPPED: None,
    AttemptEnd.ALREADY_DONE: None,
    AttemptEnd.PAUSED: Status.PAUSED,
    AttemptEnd.PAUSE_REQUESTED: None,
    AttemptEnd.RESUME_REQUESTED: None,
    AttemptEnd.CANCEL_REQUESTED: None,
    AttemptEnd.RESTART_REQUESTED: None,
    AttemptEnd.LEASE_RELEASED: None,
    AttemptEnd.RETRY_SKIPPED_REQUESTED: None,
    AttemptEnd.RETRY_SKIPPED_WITHDRAWN: None,
    AttemptEnd.RERUN_REQUESTED: None,
}


def status_of(value: str, *, job: str, slot: str) -> Status:
    """The stored status as a :class:`Status`.

    Raises:
        CorruptCheckpoint: the row holds a status no release writes (edited by hand).
    """
    try:
        return Status(value)
    except ValueError:
        raise CorruptCheckpoint(
            f"the stored status {value!r} is not one of {', '.join(s.value for s in Status)}",
            job=job,
            slot=slot,
            hint="The row was left as it is. Set status to 'failed' to resume the slot from its position, "
            "or 'done' if its work is finished",
        ) from None


def check(current: Status | None, new: Status, *, job: str, slot: str) -> None:
    """Refuse a move the table above does not allow (a bug, or a row edited by hand)."""
    if new not in TRANSITIONS[current]:
        raise CorruptCheckpoint(
            f"the slot cannot go from {current or 'no row'} to {new}", job=job, slot=slot,
            hint="The row was left as it is; look at its history (resumable_attempts) to see how it got there",
        )


class Reason(enum.StrEnum):
    """Why a run was asked to stop."""

    TIMEOUT = "timeout"
    USER = "user"
    SHUTDOWN = "shutdown"
    LEASE_LOST = "lease_lost"
    SUPERSEDED = "superseded"
    #: A newer try of the same task instance (same DAG, task, run and map index) waits for the slot
    #: this older try still holds: Airflow gave the task instance to that try (it judged this one
    #: gone: its heartbeats to the API server stopped), so this one stops at its next chunk boundary
    #: and hands the slot over with its checkpoint.
    HANDOVER = "handover"
    #: A person cancelled the run through the control API (CLI, UI, REST): not retried.
    REQUESTED = "requested"
    #: Stop at the next chunk boundary and continue later, in the same try (not a cancel: see
    #: :class:`~airflow_resumable.core.model.errors.Paused`). A person asked, through the control API.
    PAUSED = "paused"
    #: The throttle asked for a wait long enough to give the worker back.
    THROTTLED = "throttled"
    #: The attempt ran ``max_runtime`` in one go and gives its worker slot back for a moment.
    TIME_SLICE = "time_slice"
    #: SIGTERM arrived and it is not yet known whether a person or a worker shutdown sent it.
    TERMINATED = "terminated"
