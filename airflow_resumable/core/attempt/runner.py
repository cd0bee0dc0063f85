"""One attempt of one slot: the loop every entry point runs.

:class:`Attempt` is the whole life of an attempt, in order:

1. open the checkpoint database and check its schema;
2. take the slot's lease (waiting, bounded, for a live holder's lease to expire);
3. apply the overlap policy against the job's other live slots;
4. decide between resume, start over (the slot was ``done``) and restart (asked for on purpose);
5. run the handler with a :class:`~airflow_resumable.core.attempt.context.RunContext`, the lease renewed
   by a :class:`~airflow_resumable.core.attempt.lease.LeaseKeeper` thread; each ``ctx.checkpoint()`` is
   one call, ``after_chunk``: save (fenced by the lease), *then* report progress, *then* check
   the signal (core/attempt/after_chunk.py); progress is kept in one place (core/attempt/tally.py);
6. record how it ended (``done``, ``failed``, ``cancelled`` with the reason) and release the lease.

The class operator, the chunked operator and ``@task.resumable`` all run this; the chunked loop
(:func:`airflow_resumable.core.work.chunk_loop.chunk_loop`) is just a handler.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

from airflow_resumable.core.attempt.acquire import Acquiring
from airflow_resumable.core.attempt.after_chunk import Chunks
from airflow_resumable.core.attempt.async_bridge import drive
from airflow_resumable.core.attempt.context import RunContext
from airflow_resumable.core.attempt.finish import Finishing, Outcome
from airflow_resumable.core.attempt.lease import LeaseKeeper
from airflow_resumable.core.attempt.pipeline import checkpoint_writer
from airflow_resumable.core.attempt.reporter import ProgressMeter
from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.core.attempt.tally import Tally
from airflow_resumable.core.model.checkpoint import Checkpoint, Status
from airflow_resumable.core.model.errors import (
    Cancelled,
    CheckpointDeleted,
    ConfigurationError,
    CorruptCheckpoint,
    LeaseLost,
    Paused,
    ResumableError,
    StoreUnavailable,
)
from airflow_resumable.core.model.identity import Hooks, Identity
from airflow_resumable.core.model.options import (  # re-exported: the core's public names
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
)
from airflow_resumable.core.model.states import Request, check, status_of
from airflow_resumable.core.stores.base import StoreSession

__all__ = [
    "MAX_KEY_BYTES", "MAX_LEASE", "MAX_SECONDS", "MIN_LEASE", "OVERLAP_POLICIES", "Attempt", "Hooks", "Identity",
    "Options", "Outcome",
    "call_problem", "duration_problem", "key_problem", "validate_options",
]


class Attempt(Chunks, Finishing, Acquiring):
    """One attempt of one (job, slot). Create it, then call :meth:`run` once.

    The life in order is here; the steps live on their seams, each a small base class over the
    shared :class:`~airflow_resumable.core.attempt.running.AttemptState` (identity, hooks, session,
    tally): the start (:mod:`~airflow_resumable.core.attempt.acquire`: lease, overlap, resume or start
    over), the one step after each chunk (:mod:`~airflow_resumable.core.attempt.after_chunk`) and the end
    (:mod:`~airflow_resumable.core.attempt.finish`).
    """

    #: Set by the embedding before :meth:`run`: keep the attempt's connection open after a
    #: successful end, as :attr:`kept_session`, for a write that follows at once (Airflow's success
    #: confirmation) instead of connecting again. Whoever takes it closes it.
    keep_session: bool = False
    #: The attempt's open session after a successful :meth:`run` with :attr:`keep_session`; else None.
    kept_session: StoreSession | None = None

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
        try:
            session = self.store.session(autocommit=True)
        except StoreUnavailable as exc:
            exc.naming(self.job, self.slot)  # the store names the database, the attempt its job and slot
            raise
        try:
            outcome = self._run_on(session, handler)
        except BaseException as exc:
            if isinstance(exc, StoreUnavailable):  # raised deep in the store: name the attempt
                exc.naming(self.job, self.slot)
            gone = self._gone or (self._connection_lost(exc) if session.lost else None)
            session.close()
            if gone is not None and gone is not exc and not isinstance(exc, ResumableError | Cancelled):
                raise gone from exc  # lost before the handler ran (or its end was recorded anew)
            raise
        if self.keep_session and session.autocommit and not session.lost:
            self.kept_session = session
        else:
            session.close()
        return outcome

    def _run_on(self, session: StoreSession, handler: Callable[[RunContext], Any]) -> Outcome:
        """:meth:`run` on the attempt's open session."""
        self._session = session
        session.ensure_schema()
        row, created = self._acquire(session)
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
            row, resumed, resumed_from = self._begin(session, row, created, rerun_because)
        except BaseException:
            self._release(session, created=False)  # nothing started: do not hold the slot
            raise
        self._resumed, self._resumed_from = resumed, resumed_from
        tally = self._tally = Tally(row)
        ctx = self._ctx = RunContext(self, self.identity, tally, signal=self.signal, log=self.log,
                                     resumed=resumed)
        self._meter = ProgressMeter(row.processed)
        self.reporter.on_start(row, resumed=resumed)
        self.keeper = LeaseKeeper(
            self.store,
            self.fence,
            lease_seconds=self.options.lease,
            signal=self.signal,
            interval=self._heartbeat,
        ).start()
        keeper = self.keeper
        try:
            if self.options.pipeline_checkpoints:  # connects while the first chunk runs
                self._writer = checkpoint_writer(self.store, session, self.fence, signal=self.signal,
                                                 tally=tally)
            if row.cancel_request:  # accepted, but the attempt it was meant for died first
                raise self._pending_cancel(session, row)
            if row.request == Request.PAUSE:  # asked before this attempt started: pause before any work
                raise Paused(Reason.PAUSED.value, f"pause requested by {row.requested_by or '?'}")
            self._started = time.monotonic()
            result = self._call(handler, ctx)
            # Never "done" over writes since the last checkpoint that were lost (an error the handler
            # caught and went on from) or a transaction that is not the chunk's: fail, the retry redoes them.
            session.check_loan()
            # Fails here, before "done", when the value could not be kept (nor given back later).
            result_text = self._result_text(result)
            self._flush()  # "done" follows the last checkpoint: wait for a pipelined one in flight
        except BaseException as exc:
            self._quiesce(session, keeper)  # the unfinished chunk's writes go with it
            if session.lost and isinstance(exc, Exception) and not isinstance(exc, ResumableError | Cancelled):
                # The driver's error (or the handler's, over it) says less than what happened: the
                # connection is gone, and every write since the last checkpoint with it.
                self._gone = self._connection_lost(exc)
            stop = self._gone or exc
            deleted = self._deleted(session, stop)
            self._stopped(session, deleted or stop)  # through a new connection when this one is lost
            if deleted is not None:
                raise deleted from exc
            if stop is not exc:
                raise stop from exc
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

    def _call(self, handler: Callable[[RunContext], Any], ctx: RunContext) -> Any:
        """Run the handler; once it returns or raises, its context can no longer write."""
        try:
            result = handler(ctx)
            if inspect.iscoroutine(result):  # an async def handler: the same attempt, on a loop of its own
                result = drive(result, self.signal, self.log, job=self.job, slot=self.slot)
            return result
        finally:
            with self._lock:  # waits for a save another thread has under way
                self._ended = True
                if self._session is not None:
                    self._session.end_loan()  # the handles of ctx.transaction() refuse from now on

    def previous_run(self) -> Checkpoint | None:
        """``ctx.previous``, read when the handler first asks: most handlers never do, and then
        the attempt sends no statement for it. Inside the handler's open transaction it is read in
        that transaction (a commit here would commit the handler's pending writes).

        Raises:
            AttemptEnded: the handler already returned.
        """
        assert self._session is not None
        with self._lock:  # the session is the checkpoints' too (a handler's other thread)
            if self._ended:
                raise self._ended_error("ctx.previous")
            session = self._session
            return session.listings.previous(self.job, self.slot, by_time=self.scheduled_at is not None,
                                             commit=session.autocommit)

    def _deleted(self, session: StoreSession, exc: BaseException) -> CheckpointDeleted | None:
        """When ``exc`` is a lost lease the keeper or the signal noticed (they say "lost", not why),
        the error saying the row was deleted, if a second look finds it gone; else None."""
        if not isinstance(exc, LeaseLost) or isinstance(exc, CheckpointDeleted):
            return None
        why = session.fenced_out(self.fence, exc.message)
        return why if isinstance(why, CheckpointDeleted) else None

    def _quiesce(self, session: StoreSession, keeper: LeaseKeeper) -> None:
        """Let a pipelined checkpoint in flight finish (a cancel keeps the last chunk; its lost
        lease shows on the signal), stop heartbeats and roll back the unfinished chunk. The keeper
        is asked to stop before the rollback and joined after it: on SQLite its connection may be
        waiting for the write lock this session holds."""
        self._flush(close=True)
        keeper.stop(join=False)
        try:
            session.rollback()  # a no-op on a lost connection (the server rolled it back)
        except Exception:  # never in place of the error that stopped the attempt
            self.log.warning("could not roll back the unfinished chunk [job=%s slot=%s attempt=%s]", self.job,
                             self.slot, self.attempt, exc_info=True)
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
