"""How an attempt ends: the row's final status (``done``, ``paused``, ``cancelled``, ``failed``), a lost
lease, the stored outcome of a slot that was already done, and the :class:`Outcome` returned."""

from __future__ import annotations

import dataclasses
from typing import Any

from airflow_resumable.core.attempt_state import AttemptState, utcnow
from airflow_resumable.core.checkpoint import ENCODER, AttemptEnd, Checkpoint, Status, short
from airflow_resumable.core.checkpoint import error_text as _error_text
from airflow_resumable.core.errors import Cancelled, CheckpointDeleted, InvalidCheckpoint, LeaseLost, Paused
from airflow_resumable.core.signal import Reason
from airflow_resumable.core.stores.base import StoreSession


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


class Finishing(AttemptState):
    """Step 6 of :class:`~airflow_resumable.core.runner.Attempt`, and its end without running the handler."""

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
        released = dataclasses.replace(row, lease_owner=None, lease_expires_at=None)
        self.reporter.on_finish(released)
        return Outcome(result=result, checkpoint=released, resumed_from=None, already_done=True)

    def _end(
        self, session: StoreSession, status: Status, *, error: str | None = None, stop_reason: str | None = None,
        result: str | None = None, resume_in: float | None = None,
    ) -> Checkpoint:
        total = self._tally.total if self._tally is not None else None
        try:
            final = session.checkpoints.finish(
                self.fence, status=status, last_error=error,
                stop_reason=stop_reason, total=total, result=result, record_id=self._record_id,
                resume_in=resume_in, attempt=self.attempt,
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
