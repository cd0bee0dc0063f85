"""An attempt's start: take the slot's lease (waiting, bounded, for a live holder), apply the
overlap policy against the job's other live slots, and decide between resume, start over and restart."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from airflow_resumable.core.attempt.lease import STOP_POLL, stop_requested
from airflow_resumable.core.attempt.running import AttemptState
from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.core.model.checkpoint import AttemptEnd, Checkpoint, Status, encode
from airflow_resumable.core.model.errors import Cancelled, LeaseBusy, OverlapSkip, OverlapWait
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.model.request_rules import Action
from airflow_resumable.core.model.states import Request
from airflow_resumable.core.stores.base import StoreSession


class Acquiring(AttemptState):
    """Steps 2-4 of :class:`~airflow_resumable.core.attempt.runner.Attempt`: lease, overlap, resume or start over."""

    def _acquire(self, session: StoreSession) -> tuple[Checkpoint, bool]:
        deadline = time.monotonic() + self.options.effective_lease_wait
        announced = False
        while True:
            got = session.leases.acquire(self.job, self.slot, self.owner, self.options.lease)
            if got is not None:
                self._fence = Fence.of(got[0])
                return got
            holder = session.checkpoints.load(self.job, self.slot)
            if time.monotonic() >= deadline:
                raise LeaseBusy(
                    f"another attempt ({holder.lease_owner if holder else '?'}) still holds this slot's "
                    f"lease after waiting {self.options.effective_lease_wait:g}s",
                    holder=holder.lease_owner if holder else None,
                    job=self.job,
                    slot=self.slot,
                    hint="If that attempt is alive it keeps the slot; otherwise its lease expires "
                    f"within {self.options.lease:g}s and a retry takes over",
                )
            if not announced:
                self.log.warning(
                    "slot is held by %s (lease until %s); waiting up to %.0fs for it to end or expire "
                    "[job=%s slot=%s]",
                    holder.lease_owner if holder else "?",
                    holder.lease_expires_at.isoformat() if holder and holder.lease_expires_at else "?",
                    self.options.effective_lease_wait, self.job, self.slot,
                )
                announced = True
            # No lease keeper runs yet to ask the stop sources (a worker's drain): ask them here,
            # at least once a second, so a shutdown does not wait out another holder's lease.
            if not self.signal.cancelled and (stop := stop_requested()):
                self.signal.cancel(*stop)
            pause = min(max(self.options.lease / 10.0, 0.05), STOP_POLL, max(0.0, deadline - time.monotonic()))
            if self.signal.cancelled or self.signal.wait(pause):
                self._stop_waiting(holder)

    def _stop_waiting(self, holder: Checkpoint | None) -> None:
        """The signal fired while this attempt waited for another holder's lease: stop waiting.
        Nothing is written (the row is the holder's); the reason goes to the log.

        Raises:
            Cancelled: with the signal's reason (``shutdown`` for a drain, ``timeout``, ``user``).
        """
        reason, message = self._resolve(self.signal.reason, self.signal.message)
        self.signal.classify(reason, message)
        self.log.warning(
            "stopped waiting for this slot's lease (held by %s): cancelled (%s): %s; nothing was written, "
            "the row stays as its holder keeps it, and a retry waits again [job=%s slot=%s attempt=%s]",
            holder.lease_owner if holder else "?", reason, message, self.job, self.slot, self.attempt,
        )
        self.signal.raise_if_cancelled()

    def _overlap(self, session: StoreSession, row: Checkpoint, created: bool) -> None:
        policy = self.options.overlap
        if policy == "allow":
            return
        mine = (_run_started(row), row.slot)
        others = [
            o for o in session.listings.live_others(self.job, self.slot)
            if policy == "replace" or (_run_started(o), o.slot) < mine
        ]
        if not others:
            return
        slots = [o.slot for o in others]
        if policy == "replace":
            for other in others:
                if other.status == Status.PAUSED:  # nothing runs it: cancel it at once, its waiting task ends
                    session.requests.apply(self.job, other.slot, Action.CANCEL, by=f"a newer run (slot {self.slot})",
                                           outcome=AttemptEnd.CANCEL_REQUESTED, reason=Reason.SUPERSEDED,
                                           note="superseded by a newer run")
                else:
                    session.requests.cancel(self.job, other.slot, Reason.SUPERSEDED.value)
            self.log.warning(
                "asked the live run(s) of slot(s) %s to stop at their next chunk boundary (superseded) "
                "[job=%s slot=%s]", ", ".join(slots), self.job, self.slot,
            )
            return
        first = min(others, key=lambda o: (_run_started(o), o.slot))
        yielded_to = {"run_id": first.run_id, "slot": first.slot,
                      "started_at": _run_started(first).isoformat(timespec="seconds")}
        why = yielded(yielded_to, more=len(others) - 1)
        # A skip is history; a wait re-checks every overlap_poke and would flood it.
        skipped = self._unstarted(AttemptEnd.SKIPPED, row, error=f"overlap {policy}: {why}")
        session.leases.release(self.fence, delete=created, record=None if policy == "wait" else skipped)
        error = OverlapSkip if policy == "skip" else OverlapWait
        raise error(
            f"{why}; overlap policy is {policy!r}",
            others=slots,
            yielded_to=yielded_to,
            job=self.job,
            slot=self.slot,
        )

    def _release(self, session: StoreSession, created: bool) -> None:
        """Give the lease back without touching the row's progress (an overlap decision)."""
        session.leases.release(self.fence, delete=created)

    def _why_run_again(self, row: Checkpoint) -> str | None:
        """Why a ``done`` slot runs again: someone asked (restart, or the embedding says so), else None."""
        restart = self._restart_reason(row)
        if restart:
            return restart
        retry = self._retry_pending()
        if retry:
            return retry
        if self.hooks.rerun is None:
            return None
        return self.hooks.rerun(row)

    def _retry_pending(self) -> str | None:
        """Why a ``done`` slot resumes at its end: a retry of its skipped items was requested."""
        session = self._session
        n = 0 if session is None else session.skips.count(self.job, self.slot, status="retry_requested")
        return f"a retry of {n} skipped item(s) was requested" if n else None

    def _restart_reason(self, row: Checkpoint) -> str | None:
        """Why this attempt starts over on purpose (the option, or a restart request on the row)."""
        if self.options.restart:
            return "restart requested"
        if row.request == Request.RESTART:
            return f"restart requested by {row.requested_by or '?'}"
        return None

    def _pending_cancel(self, session: StoreSession, row: Checkpoint) -> Cancelled:
        """The cancel a person (or a newer run) asked for while an earlier attempt held the slot,
        which that attempt never acted on (it was killed first, or its holder was already dead):
        this attempt stops with it before any work, as the live holder would have at its next
        chunk boundary. ``start()`` kept the request for exactly this."""
        reason = row.cancel_request or Reason.REQUESTED.value
        if reason == Reason.REQUESTED.value:  # the control API recorded who asked
            asked = [r for r in session.listings.history(self.job, self.slot) if r.outcome == AttemptEnd.CANCEL_REQUESTED]
            what = f"cancelled by {(asked[-1].requested_by if asked else row.requested_by) or '?'}"
        elif reason == Reason.SUPERSEDED.value:
            what = "superseded by a newer run of the job"
        else:
            what = f"cancelled ({reason})"
        return Cancelled(reason, f"{what} while an earlier attempt held the slot, which ended before it saw the "
                         "request: this attempt stopped before any work")

    def _begin(
        self, session: StoreSession, row: Checkpoint, created: bool, rerun_because: str | None
    ) -> tuple[Checkpoint, bool, Any]:
        """Resume the slot's checkpoint, or start it over (fresh, a done slot asked to run again
        ``rerun_because``, or restart asked)."""
        has_progress = row.position is not None or row.processed > 0 or bool(row.state)
        where = f"[job={self.job} slot={self.slot} attempt={self.attempt}]"
        # A done slot asked to retry its skipped items resumes at its end: they are replayed, not the run.
        replaying = row.status == Status.DONE.value and not self._restart_reason(row) and self._retry_pending()
        if created or (not has_progress and row.status != Status.DONE.value):
            self.log.info("starting from the beginning %s", where)
        elif row.status == Status.DONE.value and not replaying:
            self.log.warning(
                "this slot finished at %s (run %s, attempt %s); running it again from the start because %s %s",
                row.finished_at.isoformat() if row.finished_at else "?", row.run_id or "?", row.attempt,
                rerun_because, where,
            )
        elif restart := self._restart_reason(row):
            self.log.warning(
                "%s: discarding the unfinished checkpoint at position=%r processed=%s "
                "(status %s) and starting over %s", restart, row.position, row.processed,
                row.status, where,
            )
        else:
            if replaying:
                self.log.warning("this slot finished at %s; %s: resuming at its end (position=%r) to replay them, "
                                 "not starting over %s", row.finished_at.isoformat() if row.finished_at else "?",
                                 replaying, row.position, where)
            else:
                self.log.warning(
                    "attempt %s: resuming from position=%r processed=%s%s (last status %s%s) [job=%s slot=%s]",
                    self.attempt, row.position, row.processed, f"/{row.total}" if row.total is not None else "",
                    row.status, f", {row.stop_reason}" if row.stop_reason else "", self.job, self.slot,
                )
            resumed_from = encode(row.position, what="position", job=self.job, slot=self.slot)
            resumed, self._record_id = session.checkpoints.start(
                self.fence, self.attempt, reset=False, resumed_from=resumed_from,
                record=self._record(resumed_from=row.position),
            )
            return resumed, True, row.position
        fresh, self._record_id = session.checkpoints.start(
            self.fence, self.attempt, reset=True, resumed_from=None,
            record=self._record(),
        )
        return fresh, False, None


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
