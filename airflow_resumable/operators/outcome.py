"""The one place where the core's outcomes become Airflow's.

| core outcome | Airflow | why |
|---|---|---|
| ``Cancelled`` (timeout, shutdown, user, terminated) | ``AirflowException``: retry | the checkpoint is kept; the retry resumes |
| ``Cancelled`` (superseded) | ``AirflowFailException``: no retry | a newer run replaced this one; a retry would fight it. Clear to resume |
| ``Cancelled`` (handover) | ``AirflowException`` | a newer try of the same task instance waited for the slot: Airflow runs that try already, and it resumes from this checkpoint |
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

**With the task's** ``retry_policy=`` (Airflow 3.3, AIP-105). Airflow asks the policy about the
exception ``execute()`` raised, except for ``AirflowFailException``, which it never retries. The
operator therefore applies the policy itself, to the core's exception (what a rule names:
``airflow_resumable.core.model.errors.Cancelled``, ``LeaseBusy``, ``ConfigurationError``, ...; the
Airflow exception is raised ``from`` it), and combines the answer with the table above:

| our table says | the user's policy says | the task |
|---|---|---|
| retry | ``FAIL`` | fails without a retry: the user's rule holds |
| retry | ``RETRY`` | retries, with the rule's ``retry_delay`` if it has one |
| retry | no opinion | retries: ours holds |
| fail without retry | ``RETRY`` | retries (up to ``retries``): the user asked explicitly |
| fail without retry | ``FAIL`` or no opinion | fails without a retry: ours holds |
| unchanged (the handler's own exception) | anything | as Airflow applies the policy: the user's rule holds |
| skip, defer, reschedule | (not asked) | unchanged: not failures, and Airflow asks no policy either |

"No opinion" is ``RetryAction.DEFAULT``, and for an ``ExceptionRetryPolicy`` anything but a rule
that names one of this package's exceptions and matches: its catch-all ``default=`` and broad rules
(``Exception``, ``AirflowException``) are meant for the handler's errors, so
``default=RetryAction.FAIL`` does not turn a drain into a failure and ``RetryRule(Exception)`` does
not retry a configuration error or a person's cancel. A ``ChainRetryPolicy`` is asked member by
member, the first opinion winning. Any other policy's answer counts as its opinion. A policy that
raises is no opinion (Airflow does the same). A cancel that reaches a *paused* task (which then
raises ``ResumableStopped`` when it wakes) is not put to the policy.
For Airflow to apply the combined answer, the operator puts :class:`CombinedRetryPolicy` in front of
the user's policy when the task runs.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.core.model.errors import (
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
from airflow_resumable.core.model.outward import outward_traceback
from airflow_resumable.version_compat import (
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
    ExceptionRetryPolicy,
    RetryAction,
    RetryDecision,
    RetryPolicy,
)

log = logging.getLogger(__name__)

#: The attribute of a raised retryable exception carrying the decision already taken for it.
_DECISION = "resumable_retry_decision"


class ResumableCancelled(AirflowException):
    """The attempt stopped at a chunk boundary; its checkpoint is kept and a retry resumes it."""

    def __init__(self, message: str, reason: str):
        self.reason = reason
        super().__init__(message)


class ResumableSuperseded(AirflowFailException):
    """A newer run of the job asked this one to stop (overlap ``replace``); Clear it to resume."""


class ResumableStopped(AirflowFailException):
    """A person cancelled the run through the control API; Clear it to resume."""


class ResumableRetried(AirflowException):
    """An outcome our table fails without a retry, retried because the task's ``retry_policy`` says so."""


class ResumableNotRetried(AirflowFailException):
    """An outcome our table retries, failed because the task's ``retry_policy`` says so."""


def to_airflow(exc: BaseException, *, job: str, slot: str, policy: RetryPolicy | None = None,
               try_number: int = 1, max_tries: int = 0, context: Any = None) -> BaseException | None:
    """The Airflow exception to raise for ``exc``, or None to let ``exc`` propagate unchanged.

    With ``policy`` (the task's ``retry_policy``, as the user gave it), the table and the policy
    combine as the module's second table says; ``try_number``, ``max_tries`` and ``context`` are
    passed to the policy.
    """
    mapped = _table(exc, job=job, slot=slot)
    if mapped is None or policy is None or isinstance(mapped, AirflowSkipException):
        return mapped
    said = opinion(policy, exc, try_number=try_number, max_tries=max_tries, context=context)
    if isinstance(mapped, AirflowFailException):
        if said is None or said.action is not RetryAction.RETRY:
            return mapped
        retried = ResumableRetried(f"{mapped} (retried: the task's retry_policy says {said.reason or 'retry'})")
        setattr(retried, _DECISION, said)
        return retried
    if said is not None and said.action is RetryAction.FAIL:
        return ResumableNotRetried(f"{mapped} (not retried: the task's retry_policy says {said.reason or 'fail'})")
    setattr(mapped, _DECISION, said or RetryDecision.default())
    return mapped


def opinion(policy: RetryPolicy, exc: BaseException, *, try_number: int, max_tries: int,
            context: Any = None) -> RetryDecision | None:
    """What ``policy`` says about ``exc`` on purpose: None for no opinion (``DEFAULT``, the
    catch-all ``default=`` of an ``ExceptionRetryPolicy``, a policy that raised)."""
    if isinstance(policy, CombinedRetryPolicy):
        policy = policy.policy
    members = getattr(policy, "policies", None)
    if type(policy).__name__ == "ChainRetryPolicy" and isinstance(members, list):
        for member in members:
            said = opinion(member, exc, try_number=try_number, max_tries=max_tries, context=context)
            if said is not None:
                return said
        return None
    try:
        if isinstance(policy, ExceptionRetryPolicy):
            rule = next((r for r in policy.rules if _names_ours(r.exception_path) and r.matches(exc)), None)
            if rule is None:
                return None
            return RetryDecision(action=rule.action, retry_delay=rule.retry_delay,
                                 reason=rule.reason or f"matched the rule for {type(exc).__name__}")
        said = policy.evaluate(exception=exc, try_number=try_number, max_tries=max_tries, context=context)
    except Exception as failed:  # as Airflow does: a broken policy is no decision
        log.error("the task's retry_policy raised while judging %s; treated as no opinion: %s", type(exc).__name__,
                  outward_traceback(failed))
        return None
    if not isinstance(said, RetryDecision) or said.action is RetryAction.DEFAULT:
        return None
    return said


def _names_ours(paths: str) -> bool:
    """Whether a rule's exception paths (comma-separated) name one of this package's exceptions."""
    return any(path.strip().startswith("airflow_resumable.") for path in paths.split(","))


class CombinedRetryPolicy(RetryPolicy):
    """The user's ``retry_policy`` behind the decision :func:`to_airflow` already took.

    Airflow asks the task's policy about the exception ``execute()`` raised. For an exception the
    operator mapped, the answer was decided with the user's policy against the core's exception
    (see the module's table) and rides on the raised exception; anything else (the handler's own
    exceptions) goes to the user's policy unchanged. Not serialized (Airflow keeps no policy in the
    serialized DAG); ``serialize()`` is the user's.
    """

    def __init__(self, policy: RetryPolicy):
        self.policy = policy

    def evaluate(self, exception: BaseException, try_number: int, max_tries: int,
                 context: Any = None) -> RetryDecision:
        decided = getattr(exception, _DECISION, None)
        if isinstance(decided, RetryDecision):
            return decided
        return self.policy.evaluate(exception=exception, try_number=try_number, max_tries=max_tries,
                                    context=context)

    def serialize(self) -> dict[str, Any]:
        return self.policy.serialize()


def _table(exc: BaseException, *, job: str, slot: str) -> BaseException | None:
    """The first table: the Airflow exception for ``exc``, or None for the handler's own."""
    where = f"[job={job!r} slot={slot!r}]"
    if isinstance(exc, Cancelled):
        if exc.reason == Reason.SUPERSEDED.value:
            return ResumableSuperseded(
                f"superseded by a newer run of the job; stopped at a chunk boundary with the checkpoint kept {where}. "
                "Clear this task to resume it"
            )
        if exc.reason == Reason.HANDOVER.value:
            return ResumableCancelled(
                f"{exc.message}; stopped at a chunk boundary {where}. Airflow runs the task instance's newer try, "
                "which resumes from this checkpoint", exc.reason,
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
