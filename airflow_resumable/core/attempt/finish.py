"""How an attempt ends: the row's final status (``done``, ``paused``, ``cancelled``, ``failed``), a lost
lease, the stored outcome of a slot that was already done, and the :class:`Outcome` returned."""

from __future__ import annotations

import dataclasses
from typing import Any

from airflow_resumable.core.attempt.running import AttemptState, utcnow
from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.core.model.checkpoint import ENCODER, AttemptEnd, Checkpoint, Status, short
from airflow_resumable.core.model.checkpoint import error_text as _error_text
from airflow_resumable.core.model.errors import Cancelled, CheckpointDeleted, InvalidCheckpoint, LeaseLost, Paused
from airflow_resumable.core.model.observe import AttemptFacts
from airflow_resumable.core.stores.base import StoreSession
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


class Finishing(AttemptState):
    """Step 6 of :class:`~airflow_resumable.core.attempt.runner.Attempt`, and its end without running the handler."""

    def facts(self) -> AttemptFacts:
        """This attempt as lineage and tracing report it (plain data, read from memory: no I/O).
        Before the lease is taken it knows its identity only; after its end, the final row's figures."""
        tally, final = self._tally, self._final
        row = final if final is not None else (tally.row if tally is not None else None)
        lost = self.signal.reason == Reason.LEASE_LOST.value
        return AttemptFacts(
            job=self.job, slot=self.slot, attempt=self.attempt,
            status="lease_lost" if lost else (row.status if row is not None else "starting"),
            resumed=self._resumed, resumed_from=self._resumed_from,
            position=row.position if row is not None else None,
            processed=row.processed if row is not None else None, total=row.total if row is not None else None,
            skipped=tally.skipped if tally is not None else None,
            stop_reason=(Reason.LEASE_LOST.value if lost else row.stop_reason) if row is not None else None,
            checkpoints=tally.checkpoints if tally is not None else None, inputs=tuple(self.inputs),
            outputs=tuple(self.outputs),
        )

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
        session.leases.release(self.fence, record=self._unstarted(AttemptEnd.ALREADY_DONE, row))
        released = self._final = dataclasses.replace(row, lease_owner=None, lease_expires_at=None)
        self.reporter.on_finish(released)
        return Outcome(result=result, checkpoint=released, resumed_from=None, already_done=True)

    def _end(
        self, session: StoreSession, status: Status, *, error: str | None = None, stop_reason: str | None = None,
        result: str | None = None, resume_in: float | None = None,
    ) -> Checkpoint:
        total = self._tally.total if self._tally is not None else None
        end: dict[str, Any] = {"status": status, "last_error": error, "stop_reason": stop_reason, "total": total,
                               "result": result, "record_id": self._record_id, "resume_in": resume_in,
                               "attempt": self.attempt}
        try:
            final = session.checkpoints.finish(self.fence, **end)
        except LeaseLost as exc:
            self.log.error("could not record status %s: %s", status, exc)
            raise
        except Exception as exc:
            if session.lost:
                final = self._end_anew(end, exc, pending=not session.autocommit)
                self.reporter.on_finish(final)
                return final
            if status is Status.DONE and not session.autocommit and self._failed_instead(session, end, exc):
                raise
            # The database refused the final write (SQLite: another writer held the file's write
            # lock for the whole busy timeout). Say so where the user looks: the row cannot.
            self.log.error(
                "could not record status %s%s (%s: %s): the row stays 'running' until its lease expires "
                "(within %gs), and the next attempt resumes from the last checkpoint [job=%s slot=%s attempt=%s]",
                status, f" with error {short(error)}" if error else "", type(exc).__name__, exc, self.options.lease,
                self.job, self.slot, self.attempt,
            )
            raise
        self._final = final
        self.reporter.on_finish(final)
        return final

    def _failed_instead(self, session: StoreSession, end: dict[str, Any], exc: Exception) -> bool:
        """``done`` could not be written in the transaction the handler left open (it changed the
        session under it: ``SET search_path``, ``SET ROLE``, a statement timeout...): roll that
        transaction back (the writes since the last checkpoint, and the settings changed in it, go
        with it) and record ``failed`` with the error, so the row says why and the retry redoes them
        instead of waiting for the lease to expire. Whether it could."""
        try:
            session.rollback()
            self._end(session, Status.FAILED, error=_error_text(exc), stop_reason=end["stop_reason"])
        except Exception:  # the row stays running: said by the caller
            return False
        self.log.error("could not record status done (%s: %s): the writes since the last checkpoint were rolled "
                       "back and the slot recorded failed; the next attempt resumes from the last checkpoint "
                       "[job=%s slot=%s attempt=%s]", type(exc).__name__, exc, self.job, self.slot, self.attempt)
        return True

    def _end_anew(self, end: dict[str, Any], exc: Exception, *, pending: bool) -> Checkpoint:
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
        tried: Status = end["status"]
        gone = self._gone or self._connection_lost(exc)
        if tried is Status.DONE and pending:
            end = {**end, "status": Status.FAILED, "last_error": _error_text(gone), "result": None}
        try:
            with self.store.open(autocommit=True) as fresh:
                try:
                    final = fresh.checkpoints.finish(self.fence, **end)
                except LeaseLost:
                    row = fresh.checkpoints.load(self.job, self.slot)  # did the lost connection commit it?
                    if (row is None or row.status != tried.value or row.lease_owner is not None
                            or row.lease_token != self.fence.token or row.attempt != self.attempt):
                        raise
                    final = row
        except LeaseLost as lost:
            self.log.error("could not record status %s: %s", tried, lost)
            raise
        except Exception as again:
            self.log.error(
                "could not record status %s%s: the connection was lost (%s) and a new one failed too (%s: %s); the "
                "row stays 'running' until its lease expires (within %gs), and the next attempt resumes from the "
                "last checkpoint [job=%s slot=%s attempt=%s]", end["status"],
                f" with error {short(end['last_error'])}" if end["last_error"] else "", _error_text(exc, 300),
                type(again).__name__, again, self.options.lease, self.job, self.slot, self.attempt,
            )
            raise gone from exc
        self.log.warning("the attempt's connection to the checkpoint database was lost (%s); recorded status %s "
                         "through a new one [job=%s slot=%s attempt=%s]", _error_text(exc, 300), final.status,
                         self.job, self.slot, self.attempt)
        if tried is Status.DONE and final.status != Status.DONE.value:
            raise gone from exc
        return final

    def _stopped(self, session: StoreSession, exc: BaseException) -> None:
        """Record how the handler stopped: lease lost, cancelled, or failed (see core/model/states.py)."""
        tally = self._tally
        assert tally is not None
        if isinstance(exc, LeaseLost) or self.signal.reason == Reason.LEASE_LOST:
            self._lost(session, exc)
        elif isinstance(exc, Paused):
            resume_in = None if exc.until is None else max(0.0, (exc.until - utcnow()).total_seconds())
            self.log.warning(
                "paused (%s: %s) at position=%r processed=%s [job=%s slot=%s attempt=%s]; the checkpoint is kept "
                "and this try continues from it %s", exc.reason, exc.message, tally.position, tally.processed, self.job,
                self.slot, self.attempt, "when resumed" if exc.until is None else f"at {exc.until.isoformat()}",
            )
            self._end(session, Status.PAUSED, stop_reason=exc.reason, resume_in=resume_in)
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
            self._end(session, Status.CANCELLED, error=message, stop_reason=reason)
        else:
            stop_reason = None
            if self.signal.cancelled:
                stop_reason = self._resolve(self.signal.reason, None)[0]
                self.signal.classify(stop_reason)
            self._end(session, Status.FAILED, error=_error_text(exc), stop_reason=stop_reason)

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
            session.checkpoints.end_record(self._record_id, AttemptEnd.LEASE_LOST, error=_error_text(exc),
                                           stop_reason=Reason.LEASE_LOST.value)
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
