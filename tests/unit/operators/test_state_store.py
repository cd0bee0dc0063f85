"""The slot's summary in Airflow's own task state store (the Storage tab's first sub-tab), written at
the pace of the XCom push, read back from Airflow's metadata database after real dag.test() runs."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_resumable.core.stores import Store
from support.gates import needs_airflow

#: Airflow's own task state store (the Storage tab) arrived in 3.3; below it the mirror is not written.
pytestmark = needs_airflow("the task state store mirror")


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


@pytest.mark.one_store("asserts what reaches Airflow's task state store, not the store", kind="sqlite")
def test_a_clear_that_discards_the_task_state_store_still_resumes_from_the_checkpoint(
    checkpoints: Store, run_dag: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Airflow's next release: a Clear of a task instance discards its task state store entries
    unless keep_task_state (newsfragment 72100). Our checkpoint is not kept there, and the mirror
    writes the summary without ever reading it back.

    Given try 1 failed at item 10 with its summary in the task state store,
    When the entries are discarded (the run is made again for the same date, as a Clear that
    discards leaves the task: its task state store empty) and the task runs again,
    Then it resumes from the checkpoint at 10 (not from the start), the mirror writes a new summary
    (done, 30 of 30), and nothing read the task state store on the way."""
    from airflow.sdk.execution_time.context import TaskStateStoreAccessor

    reads: list[str] = []
    for name in ("get", "aget"):
        real = getattr(TaskStateStoreAccessor, name, None)
        if real is not None:
            def counted(self: Any, *args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
                reads.append(_name)
                return _real(self, *args, **kwargs)
            monkeypatch.setattr(TaskStateStoreAccessor, name, counted)
    day = datetime(2026, 3, 1, tzinfo=timezone.utc)
    conf = {"items": 30, "chunk": 5, "fail": [1, 2]}
    first = run_dag("rt_no_retry", conf=conf, logical_date=day)
    assert str(first.state) == "failed"
    assert stored("rt_no_retry", first.run_id)["resumable"]["position"] == 10
    again = run_dag("rt_no_retry", conf={**conf, "fail": None}, logical_date=day)
    assert str(again.state) == "success"
    assert stored("rt_no_retry", first.run_id) == {}  # discarded: the first run's entries are gone
    summary = stored("rt_no_retry", again.run_id)["resumable"]
    assert (summary["status"], summary["processed"], summary["total"]) == ("done", 30, 30)
    with checkpoints.open(autocommit=True) as session:
        row = session.checkpoints.load("rt_no_retry.work", summary["slot"])
    assert row is not None and (row.resumed_from, row.attempts) == (10, 2)
    assert reads == [], "the mirror never reads the task state store: its discard cannot change what runs"


def test_the_summary_cuts_a_long_position_as_every_channel_does_and_never_shows_over_100_percent() -> None:
    """Given a row whose position is longer than the summary's 512 characters of JSON and whose total
    was edited by hand below what it processed, When the mirror makes its summary, Then the position
    is the view's preview (its first 512 characters and ``...``, marked ``truncated``, with its size:
    the summary's own cut kept no ``...``) and the percent is 100 (it was 150)."""
    import logging
    from types import SimpleNamespace

    from airflow_resumable.core.model.checkpoint import Checkpoint
    from airflow_resumable.operators.state_store import POSITION_LIMIT, STATE_KEY, StateStoreMirror

    written: dict[str, Any] = {}
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1)
    mirror = StateStoreMirror(logging.getLogger("airflow_resumable"), ti,
                              SimpleNamespace(set=lambda key, value: written.update({key: value})))
    position = ["p" * 600]
    text = json.dumps(position)
    mirror.write(Checkpoint(job="j", slot="s", position=position, processed=150, total=100,
                            updated_at=datetime(2026, 3, 1, tzinfo=timezone.utc)))
    summary = written[STATE_KEY]
    assert summary["position"] == {"truncated": True, "bytes": len(text), "preview": text[:POSITION_LIMIT] + "..."}
    assert (summary["processed"], summary["total"], summary["percent"]) == (150, 100, 100.0)
    assert set(summary) == {"job", "slot", "status", "position", "processed", "total", "percent", "updated_at",
                            "checkpoint_tab"}
