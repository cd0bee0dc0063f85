"""A partition outside the current plan takes no request: the core's own
request functions (``airflow_resumable.core.control.requests``, "the same API by connection id" as
``airflow_resumable.control``) must refuse it too, naming the plan, and change nothing."""

from __future__ import annotations

import pytest

from airflow_resumable.core.control import requests as core_control
from airflow_resumable.core.model.errors import RequestRefused
from airflow_resumable.core.stores import Store
from airflow_resumable.core.work.partitions import Plan, replace_plan, save_plan
from support.plan_race import replan_while_checked
from support.slots import SLOT, run_slot

JOB = "d.exp"


def _split_into_four_then_two(store: Store) -> None:
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, JOB, SLOT, Plan(4, (10, 20, 30), 40))
    for i in range(4):
        run_slot(store, f"{JOB}[{i}]", "d", task_id="exp.partition", map_index=i, n=10, fail_at=5 if i == 3 else None)
    core_control.restart(store, f"{JOB}#plan", SLOT, by="planner")
    with store.open(autocommit=True) as s:
        assert replace_plan(s, JOB, SLOT, Plan(2, (25,), 50))


@pytest.mark.parametrize("action", ["pause", "restart", "release"])
def test_the_core_s_requests_refuse_a_partition_past_the_plan_naming_it(store: Store, action: str) -> None:
    _split_into_four_then_two(store)
    call = getattr(core_control, action)
    kwargs = {"force": True} if action == "release" else {}
    with pytest.raises(RequestRefused, match="is not in job d.exp's current plan of 2 partition"):
        call(store, f"{JOB}[3]", SLOT, by="alice", **kwargs)
    with store.open() as s:
        row = s.checkpoints.load(f"{JOB}[3]", SLOT)
        assert (row.status, row.request) == ("failed", None)
        assert [h.outcome for h in s.listings.history(f"{JOB}[3]", SLOT)] == ["failed"]
    # a partition of the plan still takes what its rules take
    if action == "restart":
        assert call(store, f"{JOB}[1]", SLOT, by="alice").request == "restart"


def test_a_replan_waits_for_a_request_checked_against_the_plan_so_none_lands_past_the_new_plan(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """[3] is in the plan of 4 when alice's pause is checked; the job is split anew into 2 by another
    connection while the pause is between its check and its write. The replan must wait for the
    write (the plan checked is the plan written under), not commit in between: a pause written after
    the replan would sit on [3], whose task instance is removed, and nothing would ever carry it out.
    In the order the store allows (the pause, then the replan) the pause was asked of a partition of
    the plan of its time, as any request made before a replan is."""
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, JOB, SLOT, Plan(4, (10, 20, 30), 40))
    for i in range(4):
        run_slot(store, f"{JOB}[{i}]", "d", task_id="exp.partition", map_index=i, n=10, fail_at=5)
    # When the replan has had its chance to go first while the pause is between its check and its write
    _waited, errors = replan_while_checked(
        store, JOB, SLOT, f"{JOB}[3]", lambda: core_control.pause(store, f"{JOB}[3]", SLOT, by="alice"), monkeypatch)
    assert not errors, errors
    # Then the pause was written before the replan's restart was taken, never after it
    with store.open() as s:
        paused = [h.id for h in s.listings.history(f"{JOB}[3]", SLOT) if h.outcome == "pause_requested"]
        replanned = [h.id for h in s.listings.history(f"{JOB}#plan", SLOT) if h.outcome == "restart_requested"]
    assert paused and replanned and paused[0] < replanned[0], (paused, replanned)


def test_a_rerun_recorded_for_a_partition_past_the_plan_is_refused_naming_it_and_records_nothing(store: Store) -> None:
    """A re-run is recorded in a partition's history as a request is: [3] of a job split anew into 2
    has no task instance to run again, so its history must not say one was asked."""
    _split_into_four_then_two(store)
    with pytest.raises(RequestRefused, match="partition 3 is not in job d.exp's current plan of 2 partition"):
        core_control.record_rerun(store, JOB, "run_1", [1, 3], by="alice")
    with store.open() as s:
        for index in (1, 3):  # nothing recorded, not even for the partition of the plan asked with it
            assert "rerun_requested" not in [h.outcome for h in s.listings.history(f"{JOB}[{index}]", SLOT)]
    # a partition of the plan still takes it
    assert core_control.record_rerun(store, JOB, "run_1", [1], by="alice") == 1
    with store.open() as s:
        assert [h.outcome for h in s.listings.history(f"{JOB}[1]", SLOT)][-1] == "rerun_requested"
