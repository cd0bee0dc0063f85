"""How a resumable task ends in Airflow (dag.test(), both stores): a cancel whose holder was killed
before it saw it, and the task's ``retry_policy=`` combined with our outcome table
(airflow_resumable/operators/outcome.py).

The retry-policy table runs on one store (``one_store``: SQLite): it asserts how Airflow's policy
and our outcome table combine, which no store takes part in (the store contract suite owns the
stores' equality). The killed holder's cancel is a store's request row: it runs on both.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core.control import requests as control
from airflow_resumable.core.stores import Store
from support.gates import needs_airflow
from support.request_worker import killed_holder

#: retry_policy= is Airflow 3.3's: on an older Airflow its tests are skipped, saying so.
needs_retry_policies = needs_airflow("retry_policy=")

DAY = datetime(2026, 3, 1, tzinfo=timezone.utc)
SLOT = DAY.isoformat()


def ti_of(run: Any) -> Any:
    return run.get_task_instance("work")


def row_of(store: Store, job: str) -> Any:
    with store.open() as s:
        return s.checkpoints.load(job, SLOT)


def test_a_cancel_whose_holder_was_killed_fails_the_next_try_without_retry_and_without_running(
    checkpoints: Store, run_dag, tmp_path: Path
) -> None:
    # Given a cancel accepted by the slot's live holder, which was then killed (SIGKILL) before it saw it
    job = "ro_cancel_pending.work"
    killed_holder(checkpoints, job, SLOT, lambda: control.cancel(checkpoints, job, SLOT, by="carol"))
    # When the task's next try runs (it has retries left)
    seen = tmp_path / "seen.txt"
    run = run_dag("ro_cancel_pending", conf={"seen": str(seen)}, logical_date=DAY)
    # Then it fails without a retry, as a live cancel does, and its handler did not run
    assert str(run.state) == "failed" and ti_of(run).try_number == 1
    assert not seen.exists()
    row = row_of(checkpoints, job)
    assert (row.status, row.stop_reason, row.position, row.cancel_request) == ("cancelled", "requested", 5, None)
    assert "carol" in row.last_error


@needs_retry_policies
@pytest.mark.parametrize(("dag_id", "state", "tries", "why"), [
    ("rp_value_error_fails", "failed", 1, "the user's rule for the handler's ValueError holds"),
    ("rp_cancelled_fails", "failed", 1, "the user's rule naming Cancelled beats our retry of a timeout"),
    ("rp_catch_all_fail", "success", 2, "a catch-all default=FAIL does not lose our retry of a timeout"),
    ("rp_configuration_retried", "success", 2, "a rule naming ConfigurationError beats our fail without retry"),
    ("rp_catch_all_retry", "failed", 1, "a catch-all default=RETRY does not retry a configuration error"),
    ("rp_broad_rule_retry", "failed", 1, "a rule for every Exception does not retry a configuration error"),
])
@pytest.mark.one_store("how Airflow's retry policy and our outcome table combine")
def test_the_retry_policy_and_our_outcome_table_combine_as_the_table_says(
    checkpoints: Store, run_dag, tmp_path: Path, dag_id: str, state: str, tries: int, why: str
) -> None:
    run = run_dag(dag_id, conf={}, logical_date=DAY)
    assert (str(run.state), ti_of(run).try_number) == (state, tries), why
    row = row_of(checkpoints, f"{dag_id}.work")
    if state == "success":  # the retry resumed the slot and finished it
        assert (row.status, row.processed) == ("done", 10), why


@needs_retry_policies
def test_a_chain_of_policies_is_asked_member_by_member_and_a_policy_that_raises_has_no_opinion() -> None:
    from airflow.providers.common.compat.sdk import ChainRetryPolicy
    from airflow.sdk import ExceptionRetryPolicy, RetryAction, RetryDecision, RetryPolicy, RetryRule

    from airflow_resumable.core.model.errors import Cancelled, ConfigurationError
    from airflow_resumable.operators.outcome import (
        CombinedRetryPolicy,
        ResumableNotRetried,
        ResumableRetried,
        to_airflow,
    )

    class Broken(RetryPolicy):
        def evaluate(self, exception: BaseException, try_number: int, max_tries: int, context: Any = None) -> Any:
            raise RuntimeError("broken policy")

    chain = ChainRetryPolicy([
        Broken(),
        ExceptionRetryPolicy(rules=[RetryRule(exception=KeyError)], default=RetryAction.FAIL),
        ExceptionRetryPolicy(rules=[RetryRule(exception=ConfigurationError, retry_delay=None)]),
    ])
    retried = to_airflow(ConfigurationError("bad"), job="j", slot="s", policy=chain)
    assert isinstance(retried, ResumableRetried)
    kept = to_airflow(Cancelled("shutdown"), job="j", slot="s", policy=chain)  # nobody names Cancelled: ours
    assert CombinedRetryPolicy(chain).evaluate(kept, 1, 3) == RetryDecision.default()  # what Airflow is told
    assert isinstance(to_airflow(Cancelled("timeout"), job="j", slot="s", policy=ChainRetryPolicy([
        ExceptionRetryPolicy(rules=[RetryRule(exception=Cancelled, action=RetryAction.FAIL)])])), ResumableNotRetried)
