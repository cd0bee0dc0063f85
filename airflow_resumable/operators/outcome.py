"""The one place where the core's outcomes become Airflow's.

| core outcome | Airflow | why |
|---|---|---|
| ``Cancelled`` (timeout, shutdown, user, terminated) | ``AirflowException``: retry | the checkpoint is kept; the retry resumes |
| ``Cancelled`` (superseded) | ``AirflowFailException``: no retry | a newer run replaced this one; a retry would fight it. Clear to resume |
| ``Cancelled`` (requested) | ``AirflowFailException``: no retry | a person cancelled it through the control API (CLI, UI, REST). Clear to resume |
| ``Paused`` (paused, throttled, time_slice) | ``TaskDeferred`` (in the operator, which owns the trigger) | wait without a worker slot or a retry, then continue in the same try |
| ``CheckpointDeleted`` (a kind of ``LeaseLost``) | ``AirflowFailException``: no retry | the slot's row was deleted while the attempt ran and nobody took it over: a retry would start the slot from the beginning unasked. Restore the row and Clear to resume, or Clear to start over |
| ``LeaseLost`` | ``AirflowException`` | another attempt owns the slot; Airflow already replaced this one |
| ``LeaseBusy``, ``StoreUnavailable`` | ``AirflowException``: retry | passing conditions |
| ``OverlapSkip`` | ``AirflowSkipException`` | the seed's ``skip``: the run ends as *skipped* |
| ``OverlapWait`` | ``AirflowRescheduleException`` (in the operator, which knows the bound) | wait without a worker slot or a retry |
| ``ConfigurationError``, ``InvalidCheckpoint``, ``TransactionRefused``, ``CorruptCheckpoint``, ``SchemaVersionError`` | ``AirflowFailException`` | retrying cannot fix them |
| ``SkipLimitExceeded`` | ``AirflowFailException`` | the same items would fail again: fix the data or the code, or raise ``skip_limit``, then Clear |
| anything the handler raised | unchanged | Airflow's own retry rules apply |
"""

from __future__ import annotations

from airflow_resumable.core.errors import (
    Cancelled,
    CheckpointDeleted,
    ConfigurationError,
    CorruptCheckpoint,
    LeaseBusy,
    LeaseLost,
    OverlapSkip,
    SchemaVersionError,
    SkipLimitExceeded,
    StoreUnavailable,
)
from airflow_resumable.core.signal import Reason
from airflow_resumable.version_compat import (
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
)


class ResumableCancelled(AirflowException):
    """The attempt stopped at a chunk boundary; its checkpoint is kept and a retry resumes it."""

    def __init__(self, message: str, reason: str):
        self.reason = reason
        super().__init__(message)


class ResumableSuperseded(AirflowFailException):
    """A newer run of the job asked this one to stop (overlap ``replace``); Clear it to resume."""


class ResumableStopped(AirflowFailException):
    """A person cancelled the run through the control API; Clear it to resume."""


def to_airflow(exc: BaseException, *, job: str, slot: str) -> BaseException | None:
    """The Airflow exception to raise for ``exc``, or None to let ``exc`` propagate unchanged."""
    where = f"[job={job!r} slot={slot!r}]"
    if isinstance(exc, Cancelled):
        if exc.reason == Reason.SUPERSEDED.value:
            return ResumableSuperseded(
                f"superseded by a newer run of the job; stopped at a chunk boundary with the checkpoint kept {where}. "
                "Clear this task to resume it"
            )
        if exc.reason == Reason.REQUESTED.value:
            return ResumableStopped(
                f"{exc.message}; stopped at a chunk boundary with the checkpoint kept {where}. Not retried: "
                "Clear this task to resume it"
            )
        return ResumableCancelled(
            f"cancelled ({exc.reason}): {exc.message}; stopped at a chunk boundary with the checkpoint kept, "
            f"a retry or a Clear resumes from it {where}",
            exc.reason,
        )
    if isinstance(exc, OverlapSkip):
        return AirflowSkipException(f"skipped: {exc}")
    if isinstance(exc, (ConfigurationError, CorruptCheckpoint, SchemaVersionError, SkipLimitExceeded,
                        CheckpointDeleted)):
        return AirflowFailException(str(exc))
    if isinstance(exc, (LeaseLost, LeaseBusy, StoreUnavailable)):
        return AirflowException(str(exc))
    return None
