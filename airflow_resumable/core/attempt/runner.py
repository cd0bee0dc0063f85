"""One attempt of one slot: the loop every entry point runs.

:class:`Attempt` is the whole life of an attempt, in order (:meth:`Attempt.run`, top to bottom):

1. open the checkpoint database and check its schema;
2. take the slot's lease (waiting, bounded, for a live holder's lease to expire): what the attempt
   then holds is one value, :class:`~airflow_resumable.core.attempt.acquire.Held` (session, fence, row);
3. apply the overlap policy against the job's other live slots;
4. decide between resume, start over (the slot was ``done``) and restart (asked for on purpose);
5. make the running part, one object none of whose parts is None
   (:class:`~airflow_resumable.core.attempt.context.Running`: tally, context, lease keeper, writer), and
   run the handler with its :class:`~airflow_resumable.core.attempt.context.RunContext`, the lease renewed
   by a :class:`~airflow_resumable.core.attempt.lease.LeaseKeeper` thread; each ``ctx.checkpoint()`` is
   one call, ``after_chunk``: save (fenced by the lease), *then* report progress, *then* check
   the signal (core/attempt/context.py); progress is kept in one place (core/attempt/tally.py);
6. record how it ended (``done``, ``failed``, ``cancelled`` with the reason) and release the lease.

The class operator, the chunked operator and ``@task.resumable`` all run this; the chunked loop
(:func:`airflow_resumable.core.work.chunk_loop.chunk_loop`) is just a handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from airflow_resumable.core.attempt.acquire import (
    Begun,
    Held,
    begin,
    overlap,
    pending_cancel,
    pending_pause,
    release,
    take_lease,
    why_run_again,
)
from airflow_resumable.core.attempt.context import RunContext, Running
from airflow_resumable.core.attempt.finish import Outcome, already_done, end, result_text, stopped
from airflow_resumable.core.attempt.given import Given
from airflow_resumable.core.attempt.lease import LeaseKeeper
from airflow_resumable.core.attempt.reporter import Log, Reporter
from airflow_resumable.core.attempt.signal import Reason, Signal
from airflow_resumable.core.model.checkpoint import Checkpoint, Status
from airflow_resumable.core.model.errors import (
    Cancelled,
    CheckpointDeleted,
    ConfigurationError,
    CorruptCheckpoint,
    LeaseLost,
    OverlapSkip,
    OverlapWait,
    ResumableError,
    StoreUnavailable,
)
from airflow_resumable.core.model.identity import Hooks, Identity, Named
from airflow_resumable.core.model.observe import AttemptFacts
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
from airflow_resumable.core.model.states import check, status_of
from airflow_resumable.core.stores.base import Store, StoreSession

__all__ = [
    "MAX_KEY_BYTES", "MAX_LEASE", "MAX_SECONDS", "MIN_LEASE", "OVERLAP_POLICIES", "Attempt", "Hooks", "Identity",
    "Options", "Outcome",
    "call_problem", "duration_problem", "key_problem", "validate_options",
]


class Attempt(Named):
    """One attempt of one (job, slot): ``Attempt(store, Identity(...), hooks=..., options=...)``, then
    :meth:`run` once.

    What it is given (:attr:`given`, a :class:`~airflow_resumable.core.attempt.given.Given`: the
    arguments, checked) is all it has until it takes the lease; then :class:`~airflow_resumable.core.attempt.acquire.Held`, and once the handler
    begins, :attr:`running`. The steps are functions of those values: the start
    (:mod:`~airflow_resumable.core.attempt.acquire`), the one step after each chunk
    (:mod:`~airflow_resumable.core.attempt.context`) and the end (:mod:`~airflow_resumable.core.attempt.finish`).
    """

    #: Set by the embedding before :meth:`run`: keep the attempt's connection open after a
    #: successful end, as :attr:`kept_session`, for a write that follows at once (Airflow's success
    #: confirmation) instead of connecting again. Whoever takes it closes it.
    keep_session: bool = False
    #: The attempt's open session after a successful :meth:`run` with :attr:`keep_session`; else None.
    kept_session: StoreSession | None = None
    #: The attempt once its handler began (None before, and for a slot already done).
    running: Running | None = None
    #: What runs the handler (the test kit's interruptions strike from a subclass).
    running_type: ClassVar[type[Running]] = Running
    #: The row of a slot found already done (the handler did not run).
    _done: Checkpoint | None = None

    def __init__(self, store: Store, identity: Identity, *, hooks: Hooks | None = None, options: Options | None = None,
                 reporter: Reporter | None = None, log: Log | None = None, heartbeat: float | None = None):
        """See the class docstring; the arguments are :class:`~airflow_resumable.core.attempt.given.Given`'s
        (its Raises too)."""
        self.given = Given(store, identity, hooks=hooks, options=options, reporter=reporter, log=log,
                           heartbeat=heartbeat)
        self.identity = self.given.identity

    @property
    def signal(self) -> Signal:
        """The attempt's cancellation token: the embedding cancels the run through it (SIGTERM, a drain)."""
        return self.given.signal

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
        if self.given.options.timeout is not None:
            self.given.signal.fire_after(self.given.options.timeout)
        # Autocommit until the handler asks for ctx.transaction(): a checkpoint is then one
        # statement, one round trip.
        try:
            session = self.given.store.session(autocommit=True)
        except StoreUnavailable as exc:
            exc.naming(self.job, self.slot)  # the store names the database, the attempt its job and slot
            raise
        session.wait_for_writers()  # SQLite: another partition's long chunk is waited for, not failed on
        try:
            outcome = self._run_on(session, handler)
        except BaseException as exc:
            if isinstance(exc, StoreUnavailable):  # raised deep in the store: name the attempt
                exc.naming(self.job, self.slot)
            gone = (self.running.gone if self.running is not None else None) or (
                self.given.connection_lost(exc) if session.lost else None)
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
        """:meth:`run` on the attempt's open session: the steps of the module docstring, in order."""
        session.ensure_schema()
        held = take_lease(self.given, session)
        # A new slot's run may start with its lease (nothing else of the job live).
        begun = held.begun if held.begun is not None else self._begin(held)
        if isinstance(begun, Outcome):
            return begun
        run = self.running = self.running_type(self.given, held, begun)
        self.given.reporter.on_start(begun.row, resumed=begun.resumed)
        run.keeper.start()
        try:
            run.pipeline()  # with pipeline_checkpoints: connects while the first chunk runs
            if begun.row.cancel_request or held.stopped_for:  # accepted, but the attempt it was meant for ended first
                raise pending_cancel(session, begun.row, waited_for=held.stopped_for)
            paused = pending_pause(held, begun)  # asked before this attempt started, or met while it waited
            if paused is not None:
                raise paused
            result = run.call(handler)
            if run.stop_delivered is not None:  # caught by the handler, which returned: its work is not done
                self.given.log.warning(
                    "the handler caught the stop its checkpoint raised (%s: %s) and returned: the attempt ends "
                    "stopped, not done, and the retry resumes from the last checkpoint; let Cancelled propagate "
                    "[job=%s slot=%s]", type(run.stop_delivered).__name__, run.stop_delivered, self.job, self.slot)
                raise run.stop_delivered
            # Never "done" over writes since the last checkpoint that were lost (an error the handler
            # caught and went on from) or a transaction that is not the chunk's: fail, the retry redoes them.
            session.check_loan()
            # Fails here, before "done", when the value could not be kept (nor given back later).
            text = result_text(self.given, result)
            run.flush()  # "done" follows the last checkpoint: wait for a pipelined one in flight
        except BaseException as exc:
            run.quiesce()  # the unfinished chunk's writes go with it
            if session.lost and isinstance(exc, Exception) and not isinstance(exc, ResumableError | Cancelled):
                # The driver's error (or the handler's, over it) says less than what happened: the
                # connection is gone, and every write since the last checkpoint with it.
                run.gone = self.given.connection_lost(exc)
            stop = run.gone or exc
            deleted = _deleted(run, stop)
            self._stopped(run, deleted or stop)  # through a new connection when this one is lost
            if deleted is not None:
                raise deleted from exc
            if stop is not exc:
                raise stop from exc
            raise
        if self.given.signal.reason == Reason.LEASE_LOST:  # lost after the handler's last checkpoint
            run.quiesce()
            lost = LeaseLost("the lease was lost while the handler ran", job=self.job, slot=self.slot)
            lost = _deleted(run, lost) or lost
            self._stopped(run, lost)
            raise lost
        run.flush(close=True)
        # Writes made through ctx.transaction() after the last checkpoint commit with "done".
        run.keeper.stop(join=False)
        try:
            final = end(run, Status.DONE, result=text)
        finally:
            run.keeper.stop()
        return Outcome(result=result, checkpoint=final, resumed_from=begun.resumed_from)

    def _begin(self, held: Held) -> Begun | Outcome:
        """Steps 3 and 4 on the row whose lease the attempt holds: the slot's status, the overlap
        policy, resume or start over. An :class:`Outcome` when the slot was done already."""
        try:
            status = status_of(held.row.status, job=self.job, slot=self.slot)
            check(status, Status.RUNNING, job=self.job, slot=self.slot)
        except CorruptCheckpoint:
            release(held)  # leave the hand-edited row as it was
            raise
        rerun_because = why_run_again(self.given, held) if status is Status.DONE else None
        if status is Status.DONE and rerun_because is None:
            outcome = already_done(self.given, held)
            self._done = outcome.checkpoint
            return outcome
        try:
            overlap(self.given, held)
        except (OverlapSkip, OverlapWait):
            raise  # the lease was given back, with the skip in the history
        except BaseException:
            _release_quietly(held)  # nothing started: do not hold the slot until the lease runs out
            raise
        try:
            return begin(self.given, held, rerun_because)
        except BaseException:
            release(held)  # nothing started: do not hold the slot
            raise

    def _stopped(self, run: Running, exc: BaseException) -> None:
        """Record how the handler stopped (see :func:`~airflow_resumable.core.attempt.finish.stopped`)."""
        stopped(run, exc)

    @property
    def keeper(self) -> LeaseKeeper | None:
        """The lease keeper of the running attempt (None before its handler began)."""
        return None if self.running is None else self.running.keeper

    def facts(self) -> AttemptFacts:
        """This attempt as lineage and tracing report it (plain data, read from memory: no I/O).
        Before the lease is taken it knows its identity only; after its end, the final row's figures."""
        run = self.running
        row = self._done if run is None else (run.final or run.tally.row)
        lost = self.given.signal.reason == Reason.LEASE_LOST.value
        return AttemptFacts(
            job=self.job, slot=self.slot, attempt=self.attempt,
            status="lease_lost" if lost else (row.status if row is not None else "starting"),
            resumed=None if run is None else run.resumed, resumed_from=None if run is None else run.resumed_from,
            position=row.position if row is not None else None,
            processed=row.processed if row is not None else None, total=row.total if row is not None else None,
            skipped=None if run is None else run.tally.skipped,
            stop_reason=(Reason.LEASE_LOST.value if lost else row.stop_reason) if row is not None else None,
            checkpoints=None if run is None else run.tally.checkpoints,
            inputs=() if run is None else tuple(run.inputs), outputs=() if run is None else tuple(run.outputs),
        )


def _deleted(run: Running, exc: BaseException) -> CheckpointDeleted | None:
    """When ``exc`` is a lost lease the keeper or the signal noticed (they say "lost", not why),
    the error saying the row was deleted, if a second look finds it gone; else None."""
    if not isinstance(exc, LeaseLost) or isinstance(exc, CheckpointDeleted):
        return None
    why = run.session.fenced_out(run.fence, exc.message)
    return why if isinstance(why, CheckpointDeleted) else None


def _release_quietly(held: Held) -> None:
    """Give the lease back after the overlap check failed (a row it read cannot be decoded, the store
    went away): the check's own error is what the caller must see, not a second one of the release."""
    try:
        release(held)
    except Exception:
        pass
