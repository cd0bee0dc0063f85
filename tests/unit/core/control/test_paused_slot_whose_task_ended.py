"""A slot's status never outlives the attempt behind it, for a paused slot: a
paused task instance that Airflow then ends (``pause_timeout``'s TaskDeferralTimeout with no retry
left, a person marking it failed) leaves the row ``paused`` with nothing waiting for a resume. Every
screen kept showing it ``paused`` and offering Resume ("the paused run continues from its checkpoint,
in the same try"), a request accepted and never carried out; the jobs line counted it paused beside
a failed task instance. It is shown ``abandoned`` (saying why and what to do), offers no Resume, and
the job's line counts it so; with the task instance up for retry (its next try waits paused) it stays
``paused``."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Options, Paused, Store
from airflow_resumable.core.control import requests as core_control
from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.view import slot_detail

JOB, SLOT = "d.paused", "2026-05-01T00:00:00+00:00"
TI = Origin(dag_id="d", task_id="paused", run_id="run_1", map_index=-1)


def _paused_slot(store: Store) -> None:
    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1, total=10)
        core_control.pause(store, JOB, SLOT, by="alice")
        ctx.checkpoint(2, processed=2, total=10)  # reads the pause: stops here, paused
        raise AssertionError("not paused")

    with pytest.raises(Paused):
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="try1", origin=TI),
                options=Options(lease=30)).run(handler)


def test_a_paused_slot_whose_task_instance_ended_is_not_shown_paused_nor_offered_resume(store: Store) -> None:
    _paused_slot(store)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
        history = s.listings.history(JOB, SLOT)
        offers = s.requests.offers(JOB, SLOT)
    assert row.status == "paused" and offers["resume"] is True
    view = slot_detail(row, history=history, offers=offers, now=datetime.now(tz=timezone.utc), ti_state="failed")
    line, _rows = core_control.job_partitions(store, JOB, "run_1", task_states=lambda d, t, r: {-1: "failed"})
    assert (view["shown_status"], view["offers"]["resume"], line["partitions"]["paused"]) == ("abandoned", False, 0), (
        view["shown_status"], view["offers"], line["partitions"])


def test_a_paused_slot_whose_task_instance_waits_for_a_retry_stays_paused_and_offers_resume(store: Store) -> None:
    _paused_slot(store)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
        history = s.listings.history(JOB, SLOT)
        offers = s.requests.offers(JOB, SLOT)
    for state in ("deferred", "up_for_retry", None):
        view = slot_detail(row, history=history, offers=offers, now=datetime.now(tz=timezone.utc), ti_state=state)
        assert (view["shown_status"], view["offers"]["resume"], view["live"]) == ("paused", True, True), state
    line, _rows = core_control.job_partitions(store, JOB, "run_1", task_states=lambda d, t, r: {-1: "deferred"})
    assert line["partitions"]["paused"] == 1
