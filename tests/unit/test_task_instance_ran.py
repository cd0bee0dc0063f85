"""The Checkpoint tab's ``job=`` (GET /task-instance) shows one of the
slots its task instance ran, any of them, and none of another task instance's."""

from __future__ import annotations

from typing import Any

from airflow_resumable.core import Attempt
from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import Store

SLOT = "2026-03-01T00:00:00+00:00"


def _ran(store: Store, job: str, map_index: int) -> None:
    origin = Origin(dag_id="d", task_id="g.partition", run_id="r", map_index=map_index)
    Attempt(store, Identity(job=job, slot=SLOT, attempt=1, owner=f"{job}-o", origin=origin)).run(lambda ctx: None)


def test_job_reaches_every_slot_the_task_instance_ran_and_no_other(checkpoints: Store) -> None:
    from airflow_resumable import control

    # Given a partition's task instance (map index 3) that ran its own range and 60 ranges it took,
    # and another task instance's slot
    jobs = ["j[3]"] + [f"j[0].{n}" for n in range(1, 61)]
    for job in jobs:
        _ran(checkpoints, job, 3)
    _ran(checkpoints, "j[1]", 1)

    # When its tab is asked for each of them, and for what it did not run
    shown: dict[str, Any] = {job: control.find_detail("d", "g.partition", "r", 3, job=job) for job in jobs}
    # Then each slot it ran is shown (not "ran no slot of the job": the tab's list stops at 50)
    assert {job: None if view is None else view["job"] for job, view in shown.items()} == {job: job for job in jobs}
    # And nothing of another task instance, or of a name that is not a job it ran, is
    for other in ("j[1]", "j[3]' OR '1'='1", "j%", "x" * 10_000, ""):
        assert control.find_detail("d", "g.partition", "r", 3, job=other) is None, other
