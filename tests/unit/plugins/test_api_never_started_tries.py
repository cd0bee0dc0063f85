"""The Checkpoint tab's never-started note (``plugins/api.py`` ``never_started``) names only the
try Airflow's executor failed while it was still queued, and only while that try is the task
instance's current one.

A real ``dag.test()`` run of ``rt_manual`` gives Airflow's metadata database a task instance; the
``state mismatch`` log event the scheduler writes (``scheduler_job_runner.py``) is added by hand,
in Airflow's own words, as if try 1 had been failed while queued.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core import Store

QUEUED_MISMATCH = ("Executor LocalExecutor(parallelism=4) reported that the task instance <TaskInstance: "
                   "rt_manual.work {run} [queued]> finished with state failed, but the task instance's state "
                   "attribute is queued. Learn more: https://airflow.apache.org/docs/apache-airflow/stable/"
                   "troubleshooting.html#task-state-changed-externally")


def _mismatch(run_id: str, try_number: int) -> None:
    from airflow.models.log import Log
    from airflow.models.taskinstancekey import TaskInstanceKey
    from airflow.utils.session import create_session

    with create_session() as session:
        session.add(Log(event="state mismatch", extra=QUEUED_MISMATCH.format(run=run_id),
                        task_instance=TaskInstanceKey("rt_manual", "work", run_id, try_number, -1)))


def _set_ti(run_id: str, *, try_number: int, state: str) -> None:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(TaskInstance).where(TaskInstance.dag_id == "rt_manual", TaskInstance.run_id == run_id,
                                                   TaskInstance.task_id == "work")
                        .values(try_number=try_number, state=state))


@pytest.mark.one_store("asserts Airflow's log events and task instance only", kind="sqlite")
def test_the_note_is_not_shown_for_a_later_try_that_started(checkpoints: Store, run_dag: Any) -> None:
    """Try 1 was failed while queued (no Execution API); the user fixed the address and cleared the
    task; try 2 started and failed on its own (before any checkpoint, or as a plain task). The tab
    must not then say "Try 1 failed before it started ... the Execution API": the user would chase
    an address already fixed. While try 2 waits in the queue, try 1's note still says why."""
    from airflow_resumable.plugins.api import never_started

    run = run_dag("rt_manual")
    _mismatch(run.run_id, 1)
    # While try 1 is the current one, the note names it
    _set_ti(run.run_id, try_number=1, state="failed")
    note = never_started("rt_manual", run.run_id, "work")
    assert note is not None and note["try_number"] == 1
    # Try 2 waits in the queue (a retry, a Clear): try 1's note still says why nothing ran yet
    _set_ti(run.run_id, try_number=2, state="queued")
    assert (never_started("rt_manual", run.run_id, "work") or {}).get("try_number") == 1
    # Try 2 ran (and failed for another reason): no note about try 1
    for state in ("failed", "up_for_retry"):
        _set_ti(run.run_id, try_number=2, state=state)
        assert never_started("rt_manual", run.run_id, "work") is None, state
    # Nor once try 3 ran after it
    _set_ti(run.run_id, try_number=3, state="failed")
    assert never_started("rt_manual", run.run_id, "work") is None


@pytest.mark.one_store("asserts Airflow's log events and configuration only", kind="sqlite")
def test_the_note_never_shows_a_password_of_the_execution_api_address(
        checkpoints: Store, run_dag: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_resumable.plugins.api import never_started

    monkeypatch.setenv("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", "https://proxy:s3cr3tpw@airflow.example/execution/")
    run = run_dag("rt_manual")
    _mismatch(run.run_id, 1)
    _set_ti(run.run_id, try_number=1, state="failed")
    note = never_started("rt_manual", run.run_id, "work")
    assert note is not None
    assert "s3cr3tpw" not in repr(note), note
    assert "airflow.example/execution/" in note["message"], note


@pytest.mark.one_store("asserts Airflow's log events and configuration only", kind="sqlite")
def test_the_note_names_the_execution_api_address_the_workers_use_for_a_base_url_that_is_a_path(
        checkpoints: Store, run_dag: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[api] base_url = /airflow`` (a path only) makes Airflow's executors call
    ``http://localhost:8080/airflow/execution/`` (base_executor.get_execution_api_server_url); the
    note named ``/airflow/execution/``, an address no worker calls."""
    from airflow_resumable.plugins.api import never_started

    monkeypatch.delenv("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", raising=False)
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "/airflow")
    run = run_dag("rt_manual")
    _mismatch(run.run_id, 1)
    _set_ti(run.run_id, try_number=1, state="failed")
    note = never_started("rt_manual", run.run_id, "work")
    assert note is not None
    assert note["execution_api"] == "http://localhost:8080/airflow/execution/", note
