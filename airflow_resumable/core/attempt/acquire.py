"""An attempt's start: take the slot's lease (waiting, bounded, for a live holder), apply the
overlap policy against the job's other live slots, and decide between resume, start over and restart.

Each step is a function of the attempt's :class:`~airflow_resumable.core.attempt.given.Given` and of
what taking the lease gave it, :class:`Held`: the session, the lease's fence and the row.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime
from typing import Any

from airflow_resumable.core.attempt.given import Given
from airflow_resumable.core.attempt.lease import STOP_POLL, stop_requested
from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.core.model.checkpoint import AttemptEnd, Checkpoint, Status, encode
from airflow_resumable.core.model.errors import Cancelled, LeaseBusy, OverlapSkip, OverlapWait, Paused
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.model.outward import outward_text, outward_traceback
from airflow_resumable.core.model.request_rules import Action
from airflow_resumable.core.model.states import Request
from airflow_resumable.core.stores.base import StoreSession
from airflow_resumable.core.stores.leases import Start


@dataclasses.dataclass(frozen=True)
class Held:
    """What an attempt has once it took the slot's lease: made by :func:`take_lease`, passed down.

    Attributes:
        session: the attempt's connection to the checkpoint database.
        fence: the lease: every write the attempt makes names it.
        row: the slot's row as the lease was taken.
        created: whether taking the lease created the row (a slot never run before).
        stopped_for: a person's stop request (``requested``, ``superseded``) that this attempt saw
            pending on the holder's row while it waited, and that the holder stopped for: it was
            meant for the task, so this attempt stops with it before any work (None otherwise).
        paused_by: who asked for a pause that this attempt saw pending on the holder's row while it
            waited, and that the holder carried out (the slot ``paused``): it was meant for the task,
            so this attempt pauses before any work too (:func:`pending_pause`; None otherwise).
        begun: the run, when it started with the lease (a new row, nothing else of the job live: see
            :meth:`~airflow_resumable.core.stores.leases.Leases.acquire`); the overlap check and
            :func:`begin` are then done. None otherwise.
    """

    session: StoreSession
    fence: Fence
    row: Checkpoint
    created: bool
    stopped_for: str | None = None
    paused_by: str | None = None
    begun: Begun | None = None


@dataclasses.dataclass(frozen=True)
class Begun:
    """How the attempt began the slot's run (:func:`begin`).

    Attributes:
        row: the row as the start left it.
        resumed: whether the attempt continues an earlier attempt's checkpoint.
        resumed_from: the position it continues from (None on a fresh start).
        record_id: the attempt's history record.
    """

    row: Checkpoint
    resumed: bool
    resumed_from: Any
    record_id: int | None


def take_lease(given: Given, session: StoreSession) -> Held:
    """Take the slot's lease, waiting (bounded by ``lease_wait``) for a live holder's to end or expire.
    A holder that is an earlier try of this attempt's own task instance is asked to hand the slot
    over (:func:`older_try`), and waited for up to :data:`HANDOVER_LEASES` leases.

    Raises:
        LeaseBusy: another live attempt kept the lease past ``lease_wait``.
        Cancelled: the signal fired while waiting (nothing written).
    """
    options = given.options
    began = time.monotonic()
    deadline = began + options.effective_lease_wait
    announced = False
    asked: str | None = None  # the holder asked to hand over (its lease owner)
    written: str | None = None  # ... when this attempt wrote that request itself (it withdraws it)
    seen: str | None = None  # a person's stop request seen pending on the holder's row
    pause: str | None = None  # who asked for a pause seen pending on the holder's row
    # A slot with no row yet starts with the lease, in one statement, where the store can.
    start = Start(given.attempt, given.record(Fence(given.job, given.slot, given.owner, 1)),
                  check=options.overlap != "allow")
    try:
        while True:
            got = session.leases.acquire(given.job, given.slot, given.owner, options.lease, start=start)
            if got is not None:
                row, created, record_id = got
                if record_id is not None:
                    starting(given)
                    return Held(session, Fence.of(row), row, created, begun=Begun(row, False, None, record_id))
                stopped_for = seen if seen and (row.status, row.stop_reason) == (Status.CANCELLED.value, seen) else None
                if stopped_for is None and (seen or pause):
                    stopped_for = _cancel_of_the_pause(row)
                # (unless someone resumed or restarted the paused slot since: the pause is over)
                paused = (Status.PAUSED.value, Reason.PAUSED.value) == (row.status, row.stop_reason) and row.request not in (
                    Request.RESUME, Request.RESTART)
                paused_by = pause if pause is not None and paused else None
                return Held(session, Fence.of(row), row, created, stopped_for, paused_by)
            holder = session.checkpoints.load(given.job, given.slot)
            if holder is not None and holder.status == Status.RUNNING.value and holder.cancel_request in _PERSONS:
                seen = holder.cancel_request
            if holder is not None and holder.status == Status.RUNNING.value and holder.request == Request.PAUSE:
                pause = holder.requested_by or "?"
            if holder is not None and holder.lease_owner != asked and older_try(given, holder):
                asked = holder.lease_owner
                mine, until = _ask_handover(given, session, holder)
                written = asked if mine else written
                deadline = max(deadline, until)
                announced = True
            if time.monotonic() >= deadline:
                raise _busy(given, holder, time.monotonic() - began)
            if not announced:
                given.log.warning(
                    "slot is held by %s (lease until %s); waiting up to %.0fs for it to end or expire "
                    "[job=%s slot=%s]",
                    holder.lease_owner if holder else "?",
                    holder.lease_expires_at.isoformat() if holder and holder.lease_expires_at else "?",
                    deadline - began, given.job, given.slot,
                )
                announced = True
            _pause(given, holder, deadline)
    except BaseException:
        if written is not None:  # not waited out: the holder, if it has not read it yet, runs on
            _withdraw(given, session, written)
        raise


#: The stop requests a person (or a newer run) makes: meant for the task, whichever try holds the slot.
_PERSONS = (Reason.REQUESTED.value, Reason.SUPERSEDED.value)


def _cancel_of_the_pause(row: Checkpoint) -> str | None:
    """A person's cancel of the pause the holder carried out while this attempt waited for the slot:
    made while the holder ran on to its pause (kept pending on the paused row), or made of the paused
    slot (cancelled at once). The holder's deferral, which would have read it, is a try Airflow no
    longer runs: the cancel was the task's, so this attempt stops with it (it must neither pause in its
    place nor resume the cancelled slot). None otherwise."""
    if row.status == Status.PAUSED.value and row.cancel_request in _PERSONS:
        return row.cancel_request
    if row.status == Status.CANCELLED.value and row.stop_reason in _PERSONS and row.request is None:
        return row.stop_reason
    return None


def _busy(given: Given, holder: Checkpoint | None, waited: float) -> LeaseBusy:
    return LeaseBusy(
        f"another attempt ({holder.lease_owner if holder else '?'}) still holds this slot's "
        f"lease after waiting {waited:.1f}s",
        holder=holder.lease_owner if holder else None,
        job=given.job,
        slot=given.slot,
        hint="If that attempt is alive it keeps the slot; otherwise its lease expires "
        f"within {given.options.lease:g}s and a retry takes over",
    )


def _pause(given: Given, holder: Checkpoint | None, deadline: float) -> None:
    """Wait a moment before asking for the lease again, waking for the signal.

    Raises:
        Cancelled: the signal fired while waiting (nothing written).
    """
    signal = given.signal
    # No lease keeper runs yet to ask the stop sources (a worker's drain): ask them here,
    # at least once a second, so a shutdown does not wait out another holder's lease.
    if not signal.cancelled and (stop := stop_requested()):
        signal.cancel(*stop)
    pause = min(max(given.options.lease / 10.0, 0.05), STOP_POLL, max(0.0, deadline - time.monotonic()))
    if signal.cancelled or signal.wait(pause):
        _stop_waiting(given, holder)


def _withdraw(given: Given, session: StoreSession, holder: str) -> None:
    """Take back the handover this attempt asked of ``holder`` and will not wait out."""
    try:
        if session.requests.withdraw_handover(given.job, given.slot, holder):
            given.log.warning("took back the handover asked of %s: it runs on unless it read the request already "
                              "[job=%s slot=%s attempt=%s]", holder, given.job, given.slot, given.attempt)
    except Exception as exc:  # the error that ends the wait is the one to report
        given.log.warning("could not take back the handover asked of %s [job=%s slot=%s]\n%s", holder, given.job,
                          given.slot, outward_traceback(exc))


def older_try(given: Given, holder: Checkpoint) -> bool:
    """Whether ``holder`` (the row, as a live holder keeps it) is run by an earlier try of this
    attempt's own task instance: same DAG, task, DAG run and map index, a lower try number. Airflow
    runs one try of a task instance at a time, so it gave that one up (its heartbeats to the API server
    stopped: a network cut, a frozen supervisor) while its process still works and renews the lease."""
    o = given.origin
    return (
        holder.status == Status.RUNNING.value and holder.lease_owner is not None
        and None not in (o.dag_id, o.task_id, o.run_id, o.map_index)
        and (holder.dag_id, holder.task_id, holder.run_id, holder.map_index) == (o.dag_id, o.task_id, o.run_id, o.map_index)
        and holder.attempt < given.attempt
    )


#: How long a try that asked for a handover waits for the holder's next checkpoint, in leases (at
#: least ``lease_wait``): the holder acts on the request at that checkpoint, and a chunk is meant to
#: be well shorter than a lease. A holder that dies meanwhile lets its lease lapse within one.
HANDOVER_LEASES = 10


def _ask_handover(given: Given, session: StoreSession, holder: Checkpoint) -> tuple[bool, float]:
    """Ask the earlier try holding the slot to stop at its next chunk boundary and hand the slot
    over (reason ``handover``); returns whether this attempt wrote the request, and until when to
    wait for it (:data:`HANDOVER_LEASES`): the holder reads it with its next checkpoint. A
    stop request already pending (a person's cancel, another try's handover) is left as it is, and
    waited for the same way."""
    options = given.options
    written = session.requests.hand_over(given.job, given.slot, holder.lease_owner or "", given.origin, given.attempt)
    wait = max(options.effective_lease_wait, HANDOVER_LEASES * options.lease)
    given.log.warning(
        "slot is held by try %s of this task instance (%s), which Airflow no longer runs: %s; waiting up to %.0fs "
        "for it to end its chunk and give the slot over with its checkpoint [job=%s slot=%s attempt=%s]",
        holder.attempt, holder.lease_owner,
        "asked it to stop at its next chunk boundary (handover)" if written
        else f"a stop request is already pending on the row ({holder.cancel_request or 'written meanwhile'})",
        wait, given.job, given.slot, given.attempt,
    )
    return written, time.monotonic() + wait


def _stop_waiting(given: Given, holder: Checkpoint | None) -> None:
    """The signal fired while this attempt waited for another holder's lease: stop waiting.
    Nothing is written (the row is the holder's); the reason goes to the log.

    Raises:
        Cancelled: with the signal's reason (``shutdown`` for a drain, ``timeout``, ``user``).
    """
    signal = given.signal
    reason, message = given.resolve(signal.reason, signal.message)
    signal.classify(reason, message)
    given.log.warning(
        "stopped waiting for this slot's lease (held by %s): cancelled (%s): %s; nothing was written, "
        "the row stays as its holder keeps it, and a retry waits again [job=%s slot=%s attempt=%s]",
        holder.lease_owner if holder else "?", outward_text(reason), outward_text(message), given.job, given.slot,
        given.attempt,
    )
    signal.raise_if_cancelled()


def overlap(given: Given, held: Held) -> None:
    """Apply the overlap policy against the job's other live slots.

    Raises:
        OverlapSkip / OverlapWait: an earlier run of the job is live (policy ``skip`` / ``wait``);
            the lease was given back.
    """
    policy = given.options.overlap
    if policy == "allow":
        return
    session, row, job, slot = held.session, held.row, given.job, given.slot
    mine = (_run_started(row), row.slot)
    others = [
        o for o in session.listings.live_others(job, slot)
        if policy == "replace" or (_run_started(o), o.slot) < mine
    ]
    if not others:
        return
    slots = [o.slot for o in others]
    if policy == "replace":
        for other in others:
            if other.status == Status.PAUSED:  # nothing runs it: cancel it at once, its waiting task ends
                session.requests.apply(job, other.slot, Action.CANCEL, by=f"a newer run (slot {slot})",
                                       outcome=AttemptEnd.CANCEL_REQUESTED, reason=Reason.SUPERSEDED,
                                       note="superseded by a newer run")
            else:
                session.requests.cancel(job, other.slot, Reason.SUPERSEDED.value)
        given.log.warning(
            "asked the live run(s) of slot(s) %s to stop at their next chunk boundary (superseded) "
            "[job=%s slot=%s]", ", ".join(slots), job, slot,
        )
        return
    first = min(others, key=lambda o: (_run_started(o), o.slot))
    yielded_to = {"run_id": first.run_id, "slot": first.slot,
                  "started_at": _run_started(first).isoformat(timespec="seconds")}
    why = yielded(yielded_to, more=len(others) - 1)
    # A skip is history; a wait re-checks every overlap_poke and would flood it.
    skipped = given.unstarted(held.fence, AttemptEnd.SKIPPED, row, error=f"overlap {policy}: {why}")
    session.leases.release(held.fence, delete=held.created, record=None if policy == "wait" else skipped)
    error = OverlapSkip if policy == "skip" else OverlapWait
    raise error(f"{why}; overlap policy is {policy!r}", others=slots, yielded_to=yielded_to, job=job, slot=slot)


def release(held: Held) -> None:
    """Give the lease back without touching the row (nothing started: do not hold the slot)."""
    held.session.leases.release(held.fence, delete=False)


def why_run_again(given: Given, held: Held) -> str | None:
    """Why a ``done`` slot runs again: someone asked (restart, or the embedding says so), else None."""
    restart = _restart_reason(given, held.row)
    if restart:
        return restart
    retry = _retry_pending(given, held.session)
    if retry:
        return retry
    if given.hooks.rerun is None:
        return None
    return given.hooks.rerun(held.row)


def _retry_pending(given: Given, session: StoreSession) -> str | None:
    """Why a ``done`` slot resumes at its end: a retry of its skipped items was requested."""
    n = session.skips.count(given.job, given.slot, status="retry_requested")
    return f"a retry of {n} skipped item(s) was requested" if n else None


def _restart_reason(given: Given, row: Checkpoint) -> str | None:
    """Why this attempt starts over on purpose (the option, or a restart request on the row)."""
    if given.options.restart:
        return "restart requested"
    if row.request == Request.RESTART:
        return f"restart requested by {row.requested_by or '?'}"
    return None


def pending_cancel(session: StoreSession, row: Checkpoint, *, waited_for: str | None = None) -> Cancelled:
    """The cancel a person (or a newer run) asked for while an earlier attempt held the slot,
    which that attempt never acted on (it was killed first, or its holder was already dead, or it
    had stopped for another reason): this attempt stops with it before any work, as the live holder
    would have at its next chunk boundary. ``start()`` kept the request for exactly this. With
    ``waited_for``: the request this attempt saw pending while it waited for the slot, which the
    holder stopped for (:attr:`Held.stopped_for`)."""
    reason = waited_for or row.cancel_request or Reason.REQUESTED.value
    if reason == Reason.REQUESTED.value:  # the control API recorded who asked
        asked = [r for r in session.listings.history(row.job, row.slot) if r.outcome == AttemptEnd.CANCEL_REQUESTED]
        what = f"cancelled by {(asked[-1].requested_by if asked else row.requested_by) or '?'}"
    elif reason == Reason.SUPERSEDED.value:
        what = "superseded by a newer run of the job"
    else:
        what = f"cancelled ({reason})"
    if waited_for:
        return Cancelled(reason, f"{what} while this attempt waited for the slot, held by an earlier attempt that "
                         "stopped for it: the request was the task's, so this attempt stopped before any work too")
    return Cancelled(reason, f"{what} while an earlier attempt held the slot, which ended before it saw the "
                     "request: this attempt stopped before any work")


def pending_pause(held: Held, begun: Begun) -> Paused | None:
    """The pause this attempt honours before any work, or None. A pause asked before this attempt
    started (kept on the row for it: the holder died, or stopped for another reason such as a
    handover, before it saw the pause). Or, the rule of a pause met while this attempt waited for the
    slot (:attr:`Held.paused_by`): a person's pause accepted while an earlier try held the slot (a try
    Airflow gave up, asked to hand over), which that try carried out, was the task's, not that try's:
    its deferral is a try Airflow no longer runs, so the pause holds only if this try pauses too,
    instead of running the slot on; a resume continues it, in this try. The same as a person's cancel
    met while waiting (:func:`pending_cancel`)."""
    if begun.row.request == Request.PAUSE:
        return Paused(Reason.PAUSED.value, f"pause requested by {_pause_asked_by(held.session, begun.row)}")
    if held.paused_by is not None:
        return Paused(Reason.PAUSED.value, f"pause requested by {held.paused_by} while this attempt waited for the "
                      "slot, held by an earlier attempt that paused for it: the request was the task's, so this "
                      "attempt paused before any work too")
    return None


def _pause_asked_by(session: StoreSession, row: Checkpoint) -> str:
    """Who asked for the pause pending on ``row``: the history's last pause request (the row's
    ``requested_by`` names whoever made the last request of any kind: a Release, a cancel...)."""
    asked = [r for r in session.listings.history(row.job, row.slot) if r.outcome == AttemptEnd.PAUSE_REQUESTED]
    return (asked[-1].requested_by if asked else row.requested_by) or "?"


def begin(given: Given, held: Held, rerun_because: str | None) -> Begun:
    """Resume the slot's checkpoint, or start it over (fresh, a done slot asked to run again
    ``rerun_because``, or restart asked).

    Raises:
        LeaseLost: another attempt took the lease over first (nothing started).
    """
    session, row, log = held.session, held.row, given.log
    has_progress = row.position is not None or row.processed > 0 or bool(row.state)
    where = f"[job={given.job} slot={given.slot} attempt={given.attempt}]"
    restart = _restart_reason(given, row)
    # A done slot asked to retry its skipped items resumes at its end: they are replayed, not the run.
    replaying = row.status == Status.DONE.value and not restart and _retry_pending(given, session)
    if held.created or (not has_progress and row.status != Status.DONE.value):
        starting(given)
    elif row.status == Status.DONE.value and not replaying:
        log.warning(
            "this slot finished at %s (run %s, attempt %s); running it again from the start because %s %s",
            row.finished_at.isoformat() if row.finished_at else "?", row.run_id or "?", row.attempt,
            rerun_because, where,
        )
    elif restart:
        log.warning(
            "%s: discarding the unfinished checkpoint at position=%r processed=%s "
            "(status %s) and starting over %s", restart, row.position, row.processed,
            row.status, where,
        )
    else:
        if replaying:
            log.warning("this slot finished at %s; %s: resuming at its end (position=%r) to replay them, "
                        "not starting over %s", row.finished_at.isoformat() if row.finished_at else "?",
                        replaying, row.position, where)
        else:
            log.warning(
                "attempt %s: resuming from position=%r processed=%s%s (last status %s%s) [job=%s slot=%s]",
                given.attempt, row.position, row.processed, f"/{row.total}" if row.total is not None else "",
                row.status, f", {outward_text(row.stop_reason)}" if row.stop_reason else "", given.job, given.slot,
            )
        resumed_from = encode(row.position, what="position", job=given.job, slot=given.slot)
        resumed, record_id = session.checkpoints.start(
            held.fence, given.attempt, reset=False, resumed_from=resumed_from,
            record=given.record(held.fence, resumed_from=row.position),
        )
        return Begun(resumed, True, row.position, record_id)
    fresh, record_id = session.checkpoints.start(
        held.fence, given.attempt, reset=True, resumed_from=None, record=given.record(held.fence),
    )
    return Begun(fresh, False, None, record_id)


def starting(given: Given) -> None:
    """Say that the attempt starts the slot from the beginning (a new row, or one without progress)."""
    given.log.info("starting from the beginning [job=%s slot=%s attempt=%s]", given.job, given.slot, given.attempt)


def yielded(other: dict[str, Any], *, more: int = 0) -> str:
    """What an overlap decision yields to, in words: the run that began first, its slot and start."""
    who = f"run {other['run_id']} (slot {other['slot']})" if other.get("run_id") else f"slot {other['slot']}"
    also = f" ({more} more earlier run(s) of this job are live too)" if more else ""
    return f"{who} of this job began first, at {other['started_at']}, and is still running{also}"


def _run_started(row: Checkpoint) -> datetime:
    """When the slot's current run began, for deciding which of two live runs is the earlier one.

    A retry keeps its run's start (it is still the older run), while a slot that was ``done`` and
    runs again is a new run that starts now.
    """
    started = row.lease_acquired_at if row.status == Status.DONE.value else (row.started_at or row.lease_acquired_at)
    assert started is not None
    return started
