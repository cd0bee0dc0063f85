"""One attempt of one slot: the loop every entry point runs.

:class:`Attempt` is the whole life of an attempt, in order:

1. open the checkpoint database and check its schema;
2. take the slot's lease (waiting, bounded, for a live holder's lease to expire);
3. apply the overlap policy against the job's other live slots;
4. decide between resume, start over (the slot was ``done``) and restart (asked for on purpose);
5. run the handler with a :class:`~airflow_resumable.core.context.RunContext`, the lease renewed
   by a :class:`~airflow_resumable.core.lease.LeaseKeeper` thread; each ``ctx.checkpoint()``
   saves (fenced by the lease), *then* reports progress, *then* checks the signal;
6. record how it ended (``done``, ``failed``, ``cancelled`` with the reason) and release the lease.

The class operator, the chunked operator and ``@task.resumable`` all run this; the chunked loop
(:func:`airflow_resumable.core.chunked.chunk_loop`) is just a handler.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from typing import Any, Unpack

from airflow_resumable.core.checkpoint import (
    ENCODER,
    AttemptEnd,
    AttemptRecord,
    Checkpoint,
    Origin,
    Status,
    encode,
    short,
)
from airflow_resumable.core.checkpoint import error_text as _error_text
from airflow_resumable.core.context import RunContext, TransactionConnection
from airflow_resumable.core.errors import (
    AttemptEnded,
    Cancelled,
    CheckpointDeleted,
    ConfigurationError,
    CorruptCheckpoint,
    InvalidCheckpoint,
    LeaseBusy,
    LeaseLost,
    OverlapSkip,
    OverlapWait,
    Paused,
)
from airflow_resumable.core.identity import Hooks, Identity, LegacyArgs, split_legacy
from airflow_resumable.core.lease import STOP_POLL, LeaseKeeper, stop_requested
from airflow_resumable.core.options import (  # re-exported: the core's public names
    MAX_KEY_BYTES,
    MAX_LEASE,
    MAX_SECONDS,
    MIN_LEASE,
    OVERLAP_POLICIES,
    Options,
    call_problem,
    duration_problem,
    key_problem,
    validate_options,
    wait_seconds,
)
from airflow_resumable.core.pipeline import CheckpointWriter, checkpoint_writer
from airflow_resumable.core.progress import Log, ProgressMeter, Reporter
from airflow_resumable.core.signal import Reason, Signal
from airflow_resumable.core.skips import skip_item
from airflow_resumable.core.states import Request, check, status_of
from airflow_resumable.core.stores.base import Store, StoreSession
from airflow_resumable.core.tally import Tally

__all__ = [
    "MAX_KEY_BYTES", "MAX_LEASE", "MAX_SECONDS", "MIN_LEASE", "OVERLAP_POLICIES", "Attempt", "Hooks", "Identity",
    "Options", "Outcome",
    "call_problem", "duration_problem", "key_problem", "validate_options",
]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a finished attempt returns: the handler's value and the final row."""

    result: Any
    checkpoint: Checkpoint
    resumed_from: Any
    #: True when the slot had already finished and the handler did not run: ``result`` is the
    #: value stored when it finished.
    already_done: bool = False

    def summary(self) -> dict[str, Any]:
        """The row's figures, as the task's return value when the handler returns None. Built from
        the stored row only, so an attempt that finds the slot already done returns the same."""
        cp = self.checkpoint
        return {
            "job": cp.job,
            "slot": cp.slot,
            "position": cp.position,
            "processed": cp.processed,
            "total": cp.total,
            "status": cp.status,
            "attempts": cp.attempts,
            "resumed_from": cp.resumed_from,
        }


class Attempt:
    """One attempt of one (job, slot). Create it, then call :meth:`run` once."""

    def __init__(
        self,
        store: Store,
        identity: Identity | None = None,
        *,
        hooks: Hooks | None = None,
        options: Options | None = None,
        reporter: Reporter | None = None,
        log: Log | None = None,
        heartbeat: float | None = None,
        **legacy: Unpack[LegacyArgs],
    ):
        """See the class docstring.

        Args:
            identity: who this attempt is (job, slot, try number, lease owner, origin).
            hooks: the embedding's answers (see :class:`~airflow_resumable.core.identity.Hooks`).
            legacy: instead of ``identity`` and ``hooks``, their fields as keywords (``job=``,
                ``slot=``, ``attempt=``, ``owner=``, ``rerun=``...), as tests write them.

        Raises:
            ConfigurationError: the job or the slot cannot be a checkpoint key.
            TypeError: no identity, or a field given twice (see :func:`~airflow_resumable.core.identity.split_legacy`).
        """
        identity, hooks = split_legacy(identity, hooks, legacy)
        job, slot = identity.job, identity.slot
        job_problem, slot_problem = key_problem("job", job), key_problem("slot", slot)
        if job_problem or slot_problem:
            raise ConfigurationError(
                "; ".join(p for p in (job_problem, slot_problem) if p),
                job=None if job_problem else job,
                slot=None if slot_problem else slot,
                hint=f"Name the job with at most {MAX_KEY_BYTES} bytes and no NUL character (the operator's job=)",
            )
        self.store = store
        self.identity: Identity = identity
        self.hooks: Hooks = hooks
        # Read on every checkpoint and log line: plain attributes, copied from the frozen identity.
        self.job, self.slot, self.attempt, self.owner = job, slot, identity.attempt, identity.owner
        self.options = options or Options()
        self.log: Log = log or logging.getLogger("airflow_resumable")
        self.reporter = reporter or Reporter(self.log, interval=self.options.progress_interval)
        self.signal = Signal()
        self._heartbeat = heartbeat
        self._record_id: int | None = None
        self._started = time.monotonic()
        self._session: StoreSession | None = None
        self._token: int | None = None
        self._meter: ProgressMeter | None = None
        self._ctx: RunContext | None = None
        #: This attempt's progress, one owner (see core/tally.py); set once the handler starts.
        self._tally: Tally | None = None
        self.keeper: LeaseKeeper | None = None
        #: Writes the checkpoints with ``pipeline_checkpoints`` (see core/pipeline.py).
        self._writer: CheckpointWriter | None = None
        # Set (under the lock) once the handler has returned or raised: the run context then
        # refuses to write, whichever thread still holds it.
        self._ended = False
        self._lock = threading.Lock()

    @property
    def scheduled_at(self) -> datetime | None:
        return self.identity.scheduled_at

    @property
    def origin(self) -> Origin:
        return self.identity.origin

    # -- the run -------------------------------------------------------------------------------

    def run(self, handler: Callable[[RunContext], Any]) -> Outcome:
        """Run ``handler(ctx)`` from the slot's last checkpoint.

        Raises:
            ConfigurationError: the handler is not callable, or a checkpoint is not JSON.
            OverlapSkip / OverlapWait: another slot of the job is live (policy ``skip`` / ``wait``).
            LeaseBusy: another live attempt kept this slot's lease past ``lease_wait``.
            LeaseLost: another attempt took over this slot while this one ran.
            CheckpointDeleted: the slot's row was deleted while this attempt ran (a kind of LeaseLost).
            Cancelled: the signal fired and the handler stopped at a chunk boundary; or it fired (a
                drain, a timeout) while this attempt waited for another holder's lease (nothing
                written); or a cancel accepted for an earlier attempt that died before it saw it
                was pending (the handler did not run).
            Exception: whatever the handler raised (recorded on the row as ``failed``).
        """
        if not callable(handler):
            raise ConfigurationError(
                f"the handler must be callable, got {type(handler).__name__}",
                job=self.job,
                slot=self.slot,
                hint="Pass a function taking the run context: handler=fn, where def fn(ctx): ...",
            )
        if self.options.timeout is not None:
            self.signal.fire_after(self.options.timeout)
        # Autocommit until the handler asks for ctx.transaction(): a checkpoint is then one
        # statement, one round trip.
        with self.store.open(autocommit=True) as session:
            self._session = session
            session.ensure_schema()
            row, created = self._acquire(session)
            self._token = row.lease_token
            try:
                status = status_of(row.status, job=self.job, slot=self.slot)
                check(status, Status.RUNNING, job=self.job, slot=self.slot)
            except CorruptCheckpoint:
                self._release(session, created=False)  # leave the hand-edited row as it was
                raise
            rerun_because = self._why_run_again(row) if status is Status.DONE else None
            if status is Status.DONE and rerun_because is None:
                return self._already_done(session, row)
            self._overlap(session, row, created)
            try:
                previous = session.previous(self.job, self.slot, by_time=self.scheduled_at is not None)
                row, resumed, resumed_from = self._begin(session, row, created, rerun_because)
            except BaseException:
                self._release(session, created=False)  # nothing started: do not hold the slot
                raise
            tally = self._tally = Tally(row)
            ctx = self._ctx = RunContext(self, self.identity, tally, signal=self.signal, log=self.log,
                                         resumed=resumed, previous=previous)
            self._meter = ProgressMeter(row.processed)
            self.reporter.on_start(row, resumed=resumed)
            self.keeper = LeaseKeeper(
                self.store,
                job=self.job,
                slot=self.slot,
                owner=self.owner,
                token=self._token,
                lease_seconds=self.options.lease,
                signal=self.signal,
                interval=self._heartbeat,
            ).start()
            keeper = self.keeper
            try:
                if self.options.pipeline_checkpoints:  # connects while the first chunk runs
                    self._writer = checkpoint_writer(self.store, session, job=self.job, slot=self.slot,
                                                     owner=self.owner, token=self._token, signal=self.signal,
                                                     tally=tally)
                if row.cancel_request:  # accepted, but the attempt it was meant for died first
                    raise self._pending_cancel(session, row)
                if row.request == Request.PAUSE:  # asked before this attempt started: pause before any work
                    raise Paused(Reason.PAUSED.value, f"pause requested by {row.requested_by or '?'}")
                self._started = time.monotonic()
                result = self._call(handler, ctx)
                # Fails here, before "done", when the value could not be kept (nor given back later).
                result_text = self._result_text(result)
                self._flush()  # "done" follows the last checkpoint: wait for a pipelined one in flight
            except BaseException as exc:
                self._quiesce(session, keeper)  # the unfinished chunk's writes go with it
                deleted = self._deleted(session, exc)
                self._stopped(session, deleted or exc)
                if deleted is not None:
                    raise deleted from exc
                raise
            if self.signal.reason == Reason.LEASE_LOST:  # lost after the handler's last checkpoint
                self._quiesce(session, keeper)
                lost = LeaseLost("the lease was lost while the handler ran", job=self.job, slot=self.slot)
                lost = self._deleted(session, lost) or lost
                self._stopped(session, lost)
                raise lost
            self._flush(close=True)
            # Writes made through ctx.transaction() after the last checkpoint commit with "done".
            keeper.stop(join=False)
            try:
                final = self._end(session, Status.DONE, result=result_text)
            finally:
                keeper.stop()
            return Outcome(result=result, checkpoint=final, resumed_from=resumed_from)

    # -- steps ---------------------------------------------------------------------------------

    def _call(self, handler: Callable[[RunContext], Any], ctx: RunContext) -> Any:
        """Run the handler; once it returns or raises, its context can no longer write."""
        try:
            return handler(ctx)
        finally:
            with self._lock:  # waits for a save another thread has under way
                self._ended = True

    def _deleted(self, session: StoreSession, exc: BaseException) -> CheckpointDeleted | None:
        """When ``exc`` is a lost lease the keeper or the signal noticed (they say "lost", not why),
        the error saying the row was deleted, if a second look finds it gone; else None."""
        if not isinstance(exc, LeaseLost) or isinstance(exc, CheckpointDeleted):
            return None
        why = session.fenced_out(self.job, self.slot, exc.message)
        return why if isinstance(why, CheckpointDeleted) else None

    def _quiesce(self, session: StoreSession, keeper: LeaseKeeper) -> None:
        """Let a pipelined checkpoint in flight finish (a cancel keeps the last chunk; its lost
        lease shows on the signal), stop heartbeats and roll back the unfinished chunk. The keeper
        is asked to stop before the rollback and joined after it: on SQLite its connection may be
        waiting for the write lock this session holds."""
        self._flush(close=True)
        keeper.stop(join=False)
        session.rollback()
        keeper.stop()

    def _flush(self, *, close: bool = False) -> None:
        """Wait for the pipelined checkpoint in flight, if any (raising its failure unless ``close``)."""
        if self._writer is None:
            return
        if close:
            self._writer.close()
            self._writer = None
        else:
            self._writer.flush()

    def _acquire(self, session: StoreSession) -> tuple[Checkpoint, bool]:
        deadline = time.monotonic() + self.options.effective_lease_wait
        announced = False
        while True:
            got = session.acquire(self.job, self.slot, self.owner, self.options.lease)
            if got is not None:
                return got
            holder = session.load(self.job, self.slot)
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
            o for o in session.live_others(self.job, self.slot)
            if policy == "replace" or (_run_started(o), o.slot) < mine
        ]
        if not others:
            return
        slots = [o.slot for o in others]
        if policy == "replace":
            for other in others:
                if other.status == Status.PAUSED:  # nothing runs it: cancel it at once, its waiting task ends
                    session.request(self.job, other.slot, "cancel_now", by=f"a newer run (slot {self.slot})",
                                    outcome=AttemptEnd.CANCEL_REQUESTED,
                                    params=(Reason.SUPERSEDED.value, Reason.SUPERSEDED.value,
                                            "superseded by a newer run"))
                else:
                    session.request_cancel(self.job, other.slot, Reason.SUPERSEDED.value)
            self.log.warning(
                "asked the live run(s) of slot(s) %s to stop at their next chunk boundary (superseded) "
                "[job=%s slot=%s]", ", ".join(slots), self.job, self.slot,
            )
            return
        # A skip is history; a wait re-checks every overlap_poke and would flood it.
        skipped = self._unstarted(AttemptEnd.SKIPPED, row, error=f"overlap {policy}: an earlier run is live "
                                  f"(slot {', '.join(slots)})")
        session.release(self.job, self.slot, self.owner, delete=created, record=None if policy == "wait" else skipped)
        error = OverlapSkip if policy == "skip" else OverlapWait
        raise error(
            f"an earlier run of this job is still running (slot {', '.join(slots)}); overlap policy is {policy!r}",
            others=slots,
            job=self.job,
            slot=self.slot,
        )

    def _release(self, session: StoreSession, created: bool) -> None:
        """Give the lease back without touching the row's progress (an overlap decision)."""
        session.release(self.job, self.slot, self.owner, delete=created)

    def _why_run_again(self, row: Checkpoint) -> str | None:
        """Why a ``done`` slot runs again: someone asked (restart, or the embedding says so), else None."""
        restart = self._restart_reason(row)
        if restart:
            return restart
        if self.hooks.rerun is None:
            return None
        return self.hooks.rerun(row)

    def _restart_reason(self, row: Checkpoint) -> str | None:
        """Why this attempt starts over on purpose (the option, or a restart request on the row)."""
        if self.options.restart:
            return "restart requested"
        if row.request == Request.RESTART:
            return f"restart requested by {row.requested_by or '?'}"
        return None

    def _already_done(self, session: StoreSession, row: Checkpoint) -> Outcome:
        """The slot finished before: give the lease back and return what it stored, without
        running the handler (an automatic retry after the end-of-run window, a duplicate attempt,
        another DAG sharing the job)."""
        try:
            result = None if row.result is None else self.hooks.result_codec[1](row.result)
        except Exception as exc:  # the row is done; its copy of the result cannot be read back
            self.log.warning("could not read back the stored result of this slot (%s); returning None", exc)
            result = None
        self.log.warning(
            "this slot already finished at %s (run %s, attempt %s%s): not running it again; returning its "
            "stored outcome. To run it again on purpose, Clear the task instance after it succeeded, or "
            "trigger with conf {\"resumable_restart\": true}, or set restart=True [job=%s slot=%s attempt=%s]",
            row.finished_at.isoformat() if row.finished_at else "?", row.run_id or "?", row.attempt,
            f", {row.dag_id}.{row.task_id}" if row.dag_id else "", self.job, self.slot, self.attempt,
        )
        session.release(self.job, self.slot, self.owner, record=self._unstarted(AttemptEnd.ALREADY_DONE, row))
        released = dataclasses.replace(row, lease_owner=None, lease_expires_at=None)
        self.reporter.on_finish(released)
        return Outcome(result=result, checkpoint=released, resumed_from=None, already_done=True)

    def _pending_cancel(self, session: StoreSession, row: Checkpoint) -> Cancelled:
        """The cancel a person (or a newer run) asked for while an earlier attempt held the slot,
        which that attempt never acted on (it was killed first, or its holder was already dead):
        this attempt stops with it before any work, as the live holder would have at its next
        chunk boundary. ``start()`` kept the request for exactly this."""
        reason = row.cancel_request or Reason.REQUESTED.value
        if reason == Reason.REQUESTED.value:  # the control API recorded who asked
            asked = [r for r in session.history(self.job, self.slot) if r.outcome == AttemptEnd.CANCEL_REQUESTED]
            what = f"cancelled by {(asked[-1].requested_by if asked else row.requested_by) or '?'}"
        elif reason == Reason.SUPERSEDED.value:
            what = "superseded by a newer run of the job"
        else:
            what = f"cancelled ({reason})"
        return Cancelled(reason, f"{what} while an earlier attempt held the slot, which ended before it saw the "
                         "request: this attempt stopped before any work")

    def _unstarted(self, end: AttemptEnd, row: Checkpoint, **fields: Any) -> AttemptRecord:
        """The history record of an attempt that ended without running the handler: the row stays
        where it was."""
        return self._record(end, position_start=row.position, processed_start=row.processed,
                            position_end=row.position, processed_end=row.processed, **fields)

    def _record(self, end: AttemptEnd = AttemptEnd.RUNNING, **fields: Any) -> AttemptRecord:
        """This attempt's history record."""
        o = self.origin
        return AttemptRecord(
            job=self.job, slot=self.slot, attempt=self.attempt, owner=self.owner, host=socket.gethostname(),
            pid=os.getpid(),
            dag_id=o.dag_id, task_id=o.task_id, run_id=o.run_id, map_index=o.map_index,
            lease_token=self._token or 0, outcome=end.value, **fields,
        )

    def _begin(
        self, session: StoreSession, row: Checkpoint, created: bool, rerun_because: str | None
    ) -> tuple[Checkpoint, bool, Any]:
        """Resume the slot's checkpoint, or start it over (fresh, a done slot asked to run again
        ``rerun_because``, or restart asked)."""
        assert self._token is not None
        has_progress = row.position is not None or row.processed > 0 or bool(row.state)
        where = f"[job={self.job} slot={self.slot} attempt={self.attempt}]"
        if created or (not has_progress and row.status != Status.DONE.value):
            self.log.info("starting from the beginning %s", where)
        elif row.status == Status.DONE.value:
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
            self.log.warning(
                "attempt %s: resuming from position=%r processed=%s%s (last status %s%s) [job=%s slot=%s]",
                self.attempt, row.position, row.processed, f"/{row.total}" if row.total is not None else "",
                row.status, f", {row.cancel_reason}" if row.cancel_reason else "", self.job, self.slot,
            )
            resumed_from = encode(row.position, what="position", job=self.job, slot=self.slot)
            resumed, self._record_id = session.start(
                self.job, self.slot, self.owner, self._token, self.attempt, reset=False, resumed_from=resumed_from,
                record=self._record(resumed_from=row.position),
            )
            return resumed, True, row.position
        fresh, self._record_id = session.start(
            self.job, self.slot, self.owner, self._token, self.attempt, reset=True, resumed_from=None,
            record=self._record(),
        )
        return fresh, False, None

    def after_chunk(self, position: str, state_json: str, state: dict[str, Any], processed: int,
                    total: int | None) -> None:
        """The one step after a chunk (``ctx.checkpoint()``): save the checkpoint (JSON text,
        encoded by the context), record it in the tally, report progress when due (write before
        report), then stop at this boundary if the signal fired, or end the slice or wait as asked.

        Raises:
            AttemptEnded: the handler already returned; nothing was written.
            LeaseLost: another attempt holds the slot; nothing was committed.
            Cancelled: after the save, when the signal has fired.
            Paused / ConfigurationError: as :meth:`_between_chunks`.
        """
        tally = self._tally
        assert tally is not None
        self._save(position, state_json, processed, total)
        tally.saved(position, state, processed, total)
        self._report(tally)
        self.signal.raise_if_cancelled()
        self._between_chunks()

    def _save(self, position: str, state: str, processed: int, total: int | None) -> None:
        """Write a checkpoint, fenced by the lease, and commit it with the handler's pending writes
        (or hand it to the pipelined writer). Serialized with the attempt's end: refused once the
        handler has returned (a kept ``ctx``, a thread).

        Raises:
            AttemptEnded: the handler already returned; nothing was written.
            LeaseLost: another attempt holds the slot; nothing was committed.
        """
        assert self._session is not None and self._token is not None and self._tally is not None
        with self._lock:
            if self._ended:
                raise self._ended_error("ctx.checkpoint()")
            if self.signal.reason == Reason.LEASE_LOST:
                self._session.rollback()
                raise LeaseLost(
                    "this attempt lost its lease; the checkpoint was not written", job=self.job, slot=self.slot
                )
            if self._writer is not None:  # returns at once; raises the previous write's failure
                self._writer.submit(position=position, state=state, processed=processed, total=total)
                return
            began = time.perf_counter()
            self._session.save(
                self.job, self.slot, self.owner, self._token, position=position, state=state, processed=processed,
                total=total,
            )
            self._tally.save_seconds = time.perf_counter() - began
            self._tally.durable = (processed, total)

    def _report(self, tally: Tally) -> None:
        """Report the last durable checkpoint (pipelined: what is committed, not what is in flight),
        when a report is due.

        The row reported is the row as stored (heartbeat and lease expiry move on the keeper's
        thread), read only then: most checkpoints of a fast loop report nothing.
        """
        assert self._session is not None and self._meter is not None
        if tally.durable is None:
            return
        processed, total = tally.durable
        if self.reporter.due(processed, total):
            stored = self._session.load(self.job, self.slot) or tally.row
            self.reporter.on_checkpoint(stored, self._meter.measure(processed, total, save_seconds=tally.save_seconds))

    def _between_chunks(self) -> None:
        """After a durable checkpoint: end the time slice, or wait as the throttle asks.

        Raises:
            Paused: ``max_runtime`` ran out (``time_slice``), or the throttle asked for a wait of
                ``defer_after`` or more (``throttled``, until then).
            Cancelled: the signal fired during a short throttle wait.
            ConfigurationError: the throttle answered something that is not a wait.
        """
        options = self.options
        if options.max_runtime is not None and time.monotonic() - self._started >= options.max_runtime:
            raise Paused(
                Reason.TIME_SLICE.value,
                f"ran {time.monotonic() - self._started:.3g}s in one go (max_runtime={options.max_runtime:g}s): "
                "giving the worker back for a moment",
                until=_utcnow(),
            )
        if options.throttle is None:
            return
        assert self._ctx is not None
        answer = options.throttle(self._ctx)
        try:
            wait = wait_seconds(answer)
        except ValueError as exc:
            raise ConfigurationError(
                f"throttle {getattr(options.throttle, '__qualname__', options.throttle)!r} answered {short(answer)}: "
                f"{exc}", job=self.job, slot=self.slot,
                hint="Return the seconds to wait before the next chunk (a number or a timedelta), or None for no "
                "wait; the checkpoint is kept",
            ) from None
        if wait is None:
            return
        if wait >= options.defer_after:
            raise Paused(Reason.THROTTLED.value, f"the throttle asked to wait {wait:g}s",
                         until=_utcnow() + timedelta(seconds=wait))
        if self.signal.wait(wait):
            self.signal.raise_if_cancelled()

    def transaction(self) -> TransactionConnection:
        """The attempt's connection, lent to the handler (see :class:`TransactionConnection`).

        Raises:
            AttemptEnded: the handler already returned.
            ConfigurationError: the attempt pipelines its checkpoints, which commit on another
                connection than the handler's writes.
        """
        assert self._session is not None
        if self._ended:
            raise self._ended_error("ctx.transaction()")
        if self.options.pipeline_checkpoints:
            raise ConfigurationError(
                "ctx.transaction() cannot be used with pipeline_checkpoints=True: its writes commit with the "
                "checkpoint on the attempt's connection, while pipelined checkpoints commit on another one, "
                "during the next chunk",
                job=self.job,
                slot=self.slot,
                hint="Set pipeline_checkpoints=False to keep writes to the checkpoint database exactly once, or "
                "write to the sink on your own connection, idempotently, and commit before ctx.checkpoint()",
            )
        self._session.begin_transactions()
        return TransactionConnection(self._session.conn, self.store.dialect, job=self.job, slot=self.slot)

    def skip(self, item: Any, *, position: Any, error: BaseException, limit: int) -> int:
        """Record a skipped item (see :func:`airflow_resumable.core.skips.skip_item`)."""
        assert self._session is not None
        if self._ended:
            raise self._ended_error("ctx.skip()")
        return skip_item(self._session, job=self.job, slot=self.slot, attempt=self.attempt, item=item,
                         position=position, error=error, limit=limit, log=self.log)

    def savepoint(self) -> AbstractContextManager[None]:
        assert self._session is not None
        return self._session.savepoint(job=self.job, slot=self.slot)

    def _ended_error(self, call: str) -> AttemptEnded:
        return AttemptEnded(
            f"{call} was called after attempt {self.attempt}'s handler returned; nothing was written",
            job=self.job,
            slot=self.slot,
            hint="Checkpoint only while the handler runs: do not keep the ctx for later, and join "
            "threads that use it before the handler returns",
        )

    def _end(
        self, session: StoreSession, status: Status, *, error: str | None = None, cancel_reason: str | None = None,
        result: str | None = None, resume_in: float | None = None,
    ) -> Checkpoint:
        assert self._token is not None
        total = self._tally.total if self._tally is not None else None
        try:
            final = session.finish(
                self.job, self.slot, self.owner, self._token, status=status, last_error=error,
                cancel_reason=cancel_reason, total=total, result=result, record_id=self._record_id,
                resume_in=resume_in,
            )
        except LeaseLost as exc:
            self.log.error("could not record status %s: %s", status, exc)
            raise
        except Exception as exc:
            # The database refused the final write (SQLite: another writer held the file's write
            # lock for the whole busy timeout). Say so where the user looks: the row cannot.
            self.log.error(
                "could not record status %s%s (%s: %s): the row stays 'running' until its lease expires "
                "(within %gs), and the next attempt resumes from the last checkpoint [job=%s slot=%s attempt=%s]",
                status, f" with error {short(error)}" if error else "", type(exc).__name__, exc, self.options.lease,
                self.job, self.slot, self.attempt,
            )
            raise
        self.reporter.on_finish(final)
        return final

    def _stopped(self, session: StoreSession, exc: BaseException) -> None:
        """Record how the handler stopped: lease lost, cancelled, or failed (see core/states.py)."""
        tally = self._tally
        assert tally is not None
        if isinstance(exc, LeaseLost) or self.signal.reason == Reason.LEASE_LOST:
            self._lost(session, exc)
        elif isinstance(exc, Paused):
            resume_in = None if exc.until is None else max(0.0, (exc.until - _utcnow()).total_seconds())
            self.log.warning(
                "paused (%s: %s) at position=%r processed=%s [job=%s slot=%s attempt=%s]; the checkpoint is kept "
                "and this try continues from it %s", exc.reason, exc.message, tally.position, tally.processed, self.job,
                self.slot, self.attempt, "when resumed" if exc.until is None else f"at {exc.until.isoformat()}",
            )
            self._end(session, Status.PAUSED, cancel_reason=exc.reason, resume_in=resume_in)
        elif isinstance(exc, Cancelled):
            reason, message = self._resolve(exc.reason, exc.message)
            self.signal.classify(reason, message)
            exc.reason, exc.message = reason, message
            exc.args = (message,)
            self.log.warning(
                "cancelled (%s) at position=%r processed=%s [job=%s slot=%s attempt=%s]; "
                "the checkpoint is kept and the next attempt resumes from it",
                reason, tally.position, tally.processed, self.job, self.slot, self.attempt,
            )
            self._end(session, Status.CANCELLED, error=message, cancel_reason=reason)
        else:
            cancel_reason = None
            if self.signal.cancelled:
                cancel_reason = self._resolve(self.signal.reason, None)[0]
                self.signal.classify(cancel_reason)
            self._end(session, Status.FAILED, error=_error_text(exc), cancel_reason=cancel_reason)

    def _lost(self, session: StoreSession, exc: BaseException) -> None:
        """Another attempt owns the slot now: write nothing to the row, only end this attempt's own
        history record."""
        if isinstance(exc, CheckpointDeleted):
            self.log.error("stopped: %s [attempt=%s]", exc, self.attempt)
        else:
            self.log.error(
                "stopped: another attempt took over this slot's lease; nothing more is written "
                "[job=%s slot=%s attempt=%s]", self.job, self.slot, self.attempt,
            )
        if self._record_id is None:
            return
        try:
            session.end_record(self._record_id, AttemptEnd.LEASE_LOST, error=_error_text(exc),
                               cancel_reason=Reason.LEASE_LOST.value)
        except Exception:  # the history is a record, never a reason to hide the real outcome
            self.log.warning("could not record the lost lease in the attempt history", exc_info=True)

    def _result_text(self, result: Any) -> str | None:
        if result is None:
            return None
        try:
            return ENCODER.encode(self.hooks.result_codec[0](result))
        except Exception as exc:
            raise InvalidCheckpoint(
                f"the handler's return value {short(result)} cannot be stored ({type(exc).__name__}: {exc}); "
                "the slot was not marked done",
                job=self.job,
                slot=self.slot,
                hint="Return JSON values (numbers, strings, lists, dicts), or None; the checkpoint is kept and "
                "a retry resumes from it once the handler returns something storable",
            ) from exc

    def _resolve(self, reason: str | None, message: str | None) -> tuple[str, str]:
        """Let the embedding (Airflow) say what a bare ``terminated`` meant: ``user`` or ``shutdown``."""
        reason = reason or "unknown"
        message = message or f"cancelled: {reason}"
        if self.hooks.resolve_reason is not None:
            try:
                resolved = self.hooks.resolve_reason(reason)
            except Exception:  # never let classification hide the cancel
                self.log.exception("could not classify cancel reason %r", reason)
                return reason, message
            if isinstance(resolved, tuple):
                return resolved[0], resolved[1]
            return resolved, message
        return reason, message


def _run_started(row: Checkpoint) -> datetime:
    """When the slot's current run began, for deciding which of two live runs is the earlier one.

    A retry keeps its run's start (it is still the older run), while a slot that was ``done`` and
    runs again is a new run that starts now.
    """
    started = row.lease_acquired_at if row.status == Status.DONE.value else (row.started_at or row.lease_acquired_at)
    assert started is not None
    return started


def _utcnow() -> datetime:
    return datetime.now(tz=timezone.utc)

