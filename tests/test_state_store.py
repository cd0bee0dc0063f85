"""The slot's summary in Airflow's own task state store (the Storage tab's first sub-tab), written at
the pace of the XCom push, read back from Airflow's metadata database after real dag.test() runs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_resumable.core.stores import Store
from airflow_resumable.version_compat import needs, supports

#: Airflow's own task state store (the Storage tab) arrived in 3.3; below it the mirror is not written.
pytestmark = pytest.mark.skipif(not supports("the task state store mirror"),
                                reason=needs("the task state store mirror"))


def stored(dag_id: str, run_id: str, task_id: str = "work", map_index: int = -1) -> dict[str, Any]:
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(TaskStateStoreModel).filter(
            TaskStateStoreModel.dag_id == dag_id, TaskStateStoreModel.run_id == run_id,
            TaskStateStoreModel.task_id == task_id, TaskStateStoreModel.map_index == map_index).all()
        return {r.key: json.loads(r.value) for r in rows}


@pytest.mark.one_store("asserts what reaches Airflow's task state store, not the store", kind="sqlite")
def test_the_native_task_state_store_holds_the_slot_s_summary_and_a_link_to_its_tab(
    checkpoints: Store, run_dag: Any
) -> None:
    run = run_dag("rt_items", conf={"items": 20, "chunk": 5})
    assert str(run.state) == "success"
    summary = stored("rt_items", run.run_id)["resumable"]
    assert {k: summary[k] for k in ("job", "status", "position", "processed", "total", "percent")} == {
        "job": "rt_items.work", "status": "done", "position": 20, "processed": 20, "total": 20, "percent": 100.0}
    # The link opens the tab inside the Airflow UI, on its own route (the browser test follows it)
    assert summary["checkpoint_tab"].endswith(
        f"/dags/rt_items/runs/{run.run_id.replace(':', '%3A').replace('+', '%2B')}/tasks/work/plugin/checkpoint")


@pytest.mark.one_store("counts writes to Airflow's task state store, not the store", kind="sqlite")
def test_it_is_written_at_the_pace_of_the_xcom_push_not_per_checkpoint(
    checkpoints: Store, run_dag: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 checkpoints within the default xcom_interval (5 s): the summary is written at the end
    (and once more if the run outlasts the interval), not 20 times."""
    from airflow.sdk.execution_time.context import TaskStateStoreAccessor

    real_set = TaskStateStoreAccessor.set
    keys: list[str] = []

    def counted(self: Any, key: str, value: Any, **kwargs: Any) -> None:
        keys.append(key)
        real_set(self, key, value, **kwargs)

    monkeypatch.setattr(TaskStateStoreAccessor, "set", counted)
    run = run_dag("rt_no_retry", conf={"items": 20, "chunk": 1})
    assert str(run.state) == "success"
    assert stored("rt_no_retry", run.run_id)["resumable"]["processed"] == 20
    assert 1 <= keys.count("resumable") <= 3, keys
