"""DAGs for tests/unit/operators/test_outcome.py: how a resumable task ends in Airflow when a request
outlived its holder, and with the task's ``retry_policy=``.

conf keys: ``seen`` (a file each chunk's first item is appended to, outside the checkpoint).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, get_current_context

from airflow_resumable import ResumableOperator, RunContext
from airflow_resumable.version_compat import supports

START = datetime(2026, 1, 1)
NO_WAIT = {"retries": 2, "retry_delay": timedelta(0)}


def ten_items(ctx: RunContext) -> int:
    """Items 0..9, five a chunk, from the checkpoint; each chunk noted in conf ``seen``."""
    seen = (get_current_context()["dag_run"].conf or {}).get("seen")
    i = ctx.position or 0
    while i < 10:
        if seen:
            with open(seen, "a") as out:
                out.write(f"{i} {ctx.attempt}\n")
        i += 5
        ctx.checkpoint(i, processed=i)
    return i


def value_error_first(ctx: RunContext) -> int:
    if ctx.attempt == 1:
        raise ValueError("bad input on the first try")
    return ten_items(ctx)


def slow_first(ctx: RunContext) -> int:
    """The first try outlasts its cooperative timeout (0.5 s): Cancelled(timeout), retryable."""
    if ctx.attempt == 1:
        ctx.signal.wait(30)
        ctx.checkpoint(0, processed=0)  # raises Cancelled(timeout)
    return ten_items(ctx)


def junk_throttle_first(ctx: RunContext) -> Any:
    """Answers something that is not a wait on the first try: ConfigurationError, no retry."""
    return "soon" if ctx.attempt == 1 else None


with DAG("ro_cancel_pending", schedule="@daily", start_date=START, catchup=False) as ro_cancel_pending:
    ResumableOperator(task_id="work", handler=ten_items, **NO_WAIT)

# retry_policy= is Airflow 3.3's (AIP-105); on an older Airflow these DAGs do not exist and their
# tests say why they are skipped.
if supports("retry_policy="):
    from airflow.sdk import ExceptionRetryPolicy, RetryAction, RetryRule

    with DAG("rp_value_error_fails", schedule="@daily", start_date=START, catchup=False) as rp_value_error_fails:
        ResumableOperator(task_id="work", handler=value_error_first, **NO_WAIT, retry_policy=ExceptionRetryPolicy(
            rules=[RetryRule(exception=ValueError, action=RetryAction.FAIL, reason="bad input does not improve")]))

    with DAG("rp_cancelled_fails", schedule="@daily", start_date=START, catchup=False) as rp_cancelled_fails:
        ResumableOperator(task_id="work", handler=slow_first, timeout=0.5, **NO_WAIT, retry_policy=ExceptionRetryPolicy(
            rules=[RetryRule(exception="airflow_resumable.core.model.errors.Cancelled", action=RetryAction.FAIL)]))

    with DAG("rp_catch_all_fail", schedule="@daily", start_date=START, catchup=False) as rp_catch_all_fail:
        ResumableOperator(task_id="work", handler=slow_first, timeout=0.5, **NO_WAIT, retry_policy=ExceptionRetryPolicy(
            rules=[RetryRule(exception=KeyError, action=RetryAction.RETRY)], default=RetryAction.FAIL))

    with DAG("rp_configuration_retried", schedule="@daily", start_date=START, catchup=False) as rp_configuration_retried:
        ResumableOperator(task_id="work", handler=ten_items, throttle=junk_throttle_first, **NO_WAIT,
                          retry_policy=ExceptionRetryPolicy(rules=[RetryRule(
                              exception="airflow_resumable.core.model.errors.ConfigurationError", action=RetryAction.RETRY)]))

    with DAG("rp_catch_all_retry", schedule="@daily", start_date=START, catchup=False) as rp_catch_all_retry:
        ResumableOperator(task_id="work", handler=ten_items, throttle=junk_throttle_first, **NO_WAIT,
                          retry_policy=ExceptionRetryPolicy(rules=[], default=RetryAction.RETRY))

    with DAG("rp_broad_rule_retry", schedule="@daily", start_date=START, catchup=False) as rp_broad_rule_retry:
        ResumableOperator(task_id="work", handler=ten_items, throttle=junk_throttle_first, **NO_WAIT,
                          retry_policy=ExceptionRetryPolicy(rules=[RetryRule(exception=Exception, action=RetryAction.RETRY)]))
