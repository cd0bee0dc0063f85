"""How an attempt ends: the row's final status (``done``, ``paused``, ``cancelled``, ``failed``), a lost
lease, the stored outcome of a slot that was already done, and the :class:`Outcome` returned.

Each is a function of what the attempt has by then: :class:`~airflow_resumable.core.attempt.acquire.Held`
(the lease) for a slot already done, :class:`~airflow_resumable.core.attempt.context.Running` once the
handler ran.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from airflow_resumable.core.attempt.acquire import Held
from airflow_resumable.core.attempt.context import Running
from airflow_resumable.core.attempt.given import Given, utcnow
from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.core.model.checkpoint import ENCODER, AttemptEnd, Checkpoint, Status, short
from airflow_resumable.core.model.checkpoint import error_text as _error_text
from airflow_resumable.core.model.errors import Cancelled, CheckpointDeleted, InvalidCheckpoint, LeaseLost, Paused
from airflow_resumable.core.model.outward import outward_text, outward_traceback
from airflow_resumable.core.view import task_summary


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
        """The row's figures, as the task's return value when the handler returns None
        (:func:`~airflow_resumable.core.view.task_summary`)."""
        return task_summary(self.checkpoint)


def already_done(given: Given, held: Held) -> Outcome:
    """The slot finished before: give the lease back and return what it stored, without
    running the handler (an automatic retry after the end-of-run window, a duplicate attempt,
    another DAG sharing the job)."""
    row, log = held.row, given.log
    try:
        result = None if row.result is None else given.hooks.result_codec[1](row.result)
    except Exception as exc:  # the row is done; its copy of the result cannot be read back
        log.warning("could not read back the stored result of this slot (%s); returning None", outward_text(str(exc)))
        result = None
    log.warning(
        "this slot already finished at %s (run %s, attempt %s%s): not running it again; returning its "
        "stored outcome. To run it again on purpose, Clear the task instance after it succeeded, or "
        "trigger with conf {\"resumable_restart\": true}, or set restart=True [job=%s slot=%s attempt=%s]",
        row.finished_at.isoformat() if row.finished_at else "?", row.run_id or "?", row.attempt,
        f", {row.dag_id}.{row.task_id}" if row.dag_id else "", given.job, given.slot, given.attempt,
    )
    held.session.leases.release(held.fence, record=given.unstarted(held.fence, AttemptEnd.ALREADY_DONE, row))
    released = dataclasses.replace(row, lease_owner=None, lease_expires_at=None)
    given.reporter.on_finish(released)
    return Outcome(result=result, checkpoint=released, resumed_from=None, already_done=True)


def end(
    run: Running, status: Status, *, error: str | None = None, stop_reason: str | None = None,
    result: str | None = None, resume_in: float | None = None,
) -> Checkpoint:
    """Write the attempt's end: the row's final ``status``, the history record's end, the lease
    released (one transaction; through a new connection when the attempt's own was lost).

    Raises:
        LeaseLost: another attempt holds the slot now.
        StoreUnavailable: the end could not be recorded (see :func:`_end_anew`).
        Exception: the database refused the final write (the row stays ``running`` until its lease expires).
    """
    session, log = run.session, run.given.log
    values: dict[str, Any] = {"status": status, "last_error": error, "stop_reason": stop_reason,
                              "total": run.tally.total, "result": result, "record_id": run.record_id,
                              "resume_in": resume_in, "attempt": run.attempt}
    try:
        final = session.checkpoints.finish(run.fence, **values)
    except LeaseLost as exc:
        log.error("could not record status %s: %s", status, exc)
        raise
    except Exception as exc:
        if session.lost:
            final = _end_anew(run, values, exc, pending=not session.autocommit)
            run.given.reporter.on_finish(final)
            return final
        if status is Status.DONE and not session.autocommit and _failed_instead(run, values, exc):
            raise
        # The database refused the final write (SQLite: another writer held the file's write
        # lock for the whole busy timeout). Say so where the user looks: the row cannot.
        log.error(
            "could not record status %s%s (%s: %s): the row stays 'running' until its lease expires "
            "(within %gs), and the next attempt resumes from the last checkpoint [job=%s slot=%s attempt=%s]",
            status, f" with error {outward_text(short(error))}" if error else "", type(exc).__name__,
            outward_text(str(exc)), run.given.options.lease,
            run.job, run.slot, run.attempt,
        )
        raise
    run.final = final
    run.given.reporter.on_finish(final)
    return final


def _failed_instead(run: Running, values: dict[str, Any], exc: Exception) -> bool:
    """``done`` could not be written in the transaction the handler left open (it changed the
    session under it: ``SET search_path``, ``SET ROLE``, a statement timeout...): roll that
    transaction back (the writes since the last checkpoint, and the settings changed in it, go
    with it) and record ``failed`` with the error, so the row says why and the retry redoes them
    instead of waiting for the lease to expire. Whether it could."""
    try:
        run.session.rollback()
        end(run, Status.FAILED, error=_error_text(exc), stop_reason=values["stop_reason"])
    except Exception:  # the row stays running: said by the caller
        return False
    run.given.log.error("could not record status done (%s: %s): the writes since the last checkpoint were rolled "
                  "back and the slot recorded failed; the next attempt resumes from the last checkpoint "
                  "[job=%s slot=%s attempt=%s]", type(exc).__name__, outward_text(str(exc)), run.job, run.slot,
                  run.attempt)
    return True


def _end_anew(run: Running, values: dict[str, Any], exc: Exception, *, pending: bool) -> Checkpoint:
    """Record the attempt's end through a new connection: the attempt's own was lost (``exc``)
    while it recorded it (or before).

    ``done`` is recorded only when nothing can have been pending on the lost connection (it was
    in autocommit: every checkpoint committed alone). Once the handler used ``ctx.transaction()``
    (``pending``), writes made after the last checkpoint would have committed with ``done`` and
    went with the connection, and nothing can tell whether there were any: the slot is recorded
    ``failed`` instead and :class:`StoreUnavailable` raised; the retry resumes at the last
    checkpoint and redoes them. An end the lost connection did commit (it
    went after the server's commit, before its answer) is read back, not written again.

    Raises:
        StoreUnavailable: ``done`` could not be recorded (pending writes were lost), or no new
            connection could record anything (the row stays ``running`` until its lease expires).
        LeaseLost: another attempt holds the slot now.
    """
    tried: Status = values["status"]
    log, fence = run.given.log, run.fence
    gone = run.gone or run.given.connection_lost(exc)
    if tried is Status.DONE and pending:
        values = {**values, "status": Status.FAILED, "last_error": _error_text(gone), "result": None}
    try:
        with run.given.store.open(autocommit=True) as fresh:
            try:
                final = fresh.checkpoints.finish(fence, **values)
            except LeaseLost:
                row = fresh.checkpoints.load(run.job, run.slot)  # did the lost connection commit it?
                if (row is None or row.status != tried.value or row.lease_owner is not None
                        or row.lease_token != fence.token or row.attempt != run.attempt):
                    raise
                final = row
    except LeaseLost as lost:
        log.error("could not record status %s: %s", tried, lost)
        raise
    except Exception as again:
        log.error(
            "could not record status %s%s: the connection was lost (%s) and a new one failed too (%s: %s); the "
            "row stays 'running' until its lease expires (within %gs), and the next attempt resumes from the "
            "last checkpoint [job=%s slot=%s attempt=%s]", values["status"],
            f" with error {outward_text(short(values['last_error']))}" if values["last_error"] else "",
            outward_text(_error_text(exc, 300)), type(again).__name__, outward_text(str(again)), run.given.options.lease,
            run.job, run.slot, run.attempt,
        )
        raise gone from exc
    log.warning("the attempt's connection to the checkpoint database was lost (%s); recorded status %s "
                "through a new one [job=%s slot=%s attempt=%s]", outward_text(_error_text(exc, 300)), final.status,
                run.job, run.slot, run.attempt)
    if tried is Status.DONE and final.status != Status.DONE.value:
        raise gone from exc
    return final


def stopped(run: Running, exc: BaseException) -> None:
    """Record how the handler stopped: lease lost, paused, cancelled, or failed (see core/model/states.py)."""
    tally, given = run.tally, run.given
    signal, log = given.signal, given.log
    if isinstance(exc, LeaseLost) or signal.reason == Reason.LEASE_LOST:
        _lost(run, exc)
    elif isinstance(exc, Paused):
        resume_in = None if exc.until is None else max(0.0, (exc.until - utcnow()).total_seconds())
        log.warning(
            "paused (%s: %s) at position=%r processed=%s [job=%s slot=%s attempt=%s]; the checkpoint is kept "
            "and this try continues from it %s", outward_text(exc.reason), outward_text(exc.message), tally.position,
            tally.processed, run.job,
            run.slot, run.attempt, "when resumed" if exc.until is None else f"at {exc.until.isoformat()}",
        )
        end(run, Status.PAUSED, stop_reason=exc.reason, resume_in=resume_in)
    elif isinstance(exc, Cancelled):
        reason, message = given.resolve(exc.reason, exc.message)
        signal.classify(reason, message)
        exc.reason, exc.message = reason, message
        exc.args = (message,)
        log.warning(
            "cancelled (%s) at position=%r processed=%s [job=%s slot=%s attempt=%s]; "
            "the checkpoint is kept and the next attempt resumes from it",
            outward_text(reason), tally.position, tally.processed, run.job, run.slot, run.attempt,
        )
        end(run, Status.CANCELLED, error=message, stop_reason=reason)
    else:
        stop_reason = None
        if signal.cancelled:
            stop_reason = given.resolve(signal.reason, None)[0]
            signal.classify(stop_reason)
        end(run, Status.FAILED, error=_error_text(exc), stop_reason=stop_reason)


def _lost(run: Running, exc: BaseException) -> None:
    """Another attempt owns the slot now: write nothing to the row, only end this attempt's own
    history record."""
    if isinstance(exc, CheckpointDeleted):
        run.given.log.error("stopped: %s [attempt=%s]", exc, run.attempt)
    else:  # the error names the cause: the attempt that holds the lease now, a release, or this one's stall
        run.given.log.error(
            "stopped: this attempt lost the slot's lease (%s); nothing more is written [job=%s slot=%s attempt=%s]",
            outward_text(getattr(exc, "message", None) or str(exc)), run.job, run.slot, run.attempt,
        )
    if run.record_id is None:
        return
    try:
        run.session.checkpoints.end_record(run.record_id, AttemptEnd.LEASE_LOST, error=_error_text(exc),
                                           stop_reason=Reason.LEASE_LOST.value)
    except Exception as error:  # the history is a record, never a reason to hide the real outcome
        run.given.log.warning("could not record the lost lease in the attempt history\n%s", outward_traceback(error))


def result_text(given: Given, result: Any) -> str | None:
    """The handler's return value as the row keeps it (JSON text), or None.

    Raises:
        InvalidCheckpoint: the value cannot be kept (the slot is not marked done).
    """
    if result is None:
        return None
    try:
        return ENCODER.encode(given.hooks.result_codec[0](result))
    except Exception as exc:
        raise InvalidCheckpoint(
            f"the handler's return value {short(result)} cannot be stored ({type(exc).__name__}: {exc}); "
            "the slot was not marked done",
            job=given.job,
            slot=given.slot,
            hint="Return JSON values (numbers, strings, lists, dicts), or None; the checkpoint is kept and "
            "a retry resumes from it once the handler returns something storable",
        ) from exc
