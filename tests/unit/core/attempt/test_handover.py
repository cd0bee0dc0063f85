"""Handover: a newer try of a task instance takes the slot from the older try that Airflow gave up
while that try's process still works (cut off from the API server, not from the checkpoint database)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.core import Attempt, LeaseBusy, Options, Store
from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.identity import Identity
from support.lease_worker import JOB, SLOT, Worker, make_sink

TI = Origin(dag_id="export", task_id="customers", run_id="scheduled__2026-05-01", map_index=-1)
ITEMS, CHUNK = 300, 5


def _handler(ctx: Any) -> int:
    """The lease worker's handler, in this process: each chunk's items into ``sink`` with its checkpoint."""
    i = ctx.position or 0
    while i < ITEMS:
        batch = list(range(i, min(i + CHUNK, ITEMS)))
        cur = ctx.transaction().cursor()
        for item in batch:
            cur.execute("INSERT INTO sink (item, owner) VALUES (%s, %s)", (item, "try2"))
        i = batch[-1] + 1
        ctx.checkpoint(i, processed=i, total=ITEMS)
    return i


def _sink_counts(store: Store) -> tuple[list[Any], int]:
    with store.open() as s:
        cur = s.conn.cursor()
        cur.execute("SELECT item, count(*) FROM sink GROUP BY item HAVING count(*) <> 1")
        twice = cur.fetchall()
        cur.execute("SELECT count(*) FROM sink")
        (total,) = cur.fetchone()
        s.commit()
    return twice, total


def test_a_newer_try_takes_the_slot_from_the_live_older_try_it_replaces(store: Store) -> None:
    make_sink(store)
    # Given try 1 of the task instance still running and renewing its lease (Airflow has given it up)
    older = Worker(store, attempt=1, items=ITEMS, chunk=CHUNK, chunk_s=0.05, lease=1.5, origin=TI)
    older.wait_checkpoints(3)
    # When try 2 of the same task instance starts, with a lease_wait far shorter than the older try's work
    run = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI),
                  options=Options(lease=1.5, lease_wait=0.2))
    outcome = run.run(_handler)
    # Then try 1 stopped at a chunk boundary, asked to hand over, and try 2 resumed from its checkpoint
    stop = older.stopped(timeout=60)
    assert (stop["error"], stop["reason"]) == ("Cancelled", "handover"), stop
    assert older.proc.wait(30) == 3
    assert outcome.checkpoint.status == "done" and outcome.resumed_from, outcome
    # and every item went through exactly once, across both tries
    assert _sink_counts(store) == ([], ITEMS)
    with store.open() as s:
        history = s.listings.history(JOB, SLOT)
        row = s.checkpoints.load(JOB, SLOT)
    first = [r for r in history if r.attempt == 1]
    assert first and first[-1].stop_reason == "handover", history
    assert row.cancel_request is None and row.stop_reason is None


def test_a_holder_of_another_task_instance_is_not_asked_to_hand_over(store: Store) -> None:
    # Given the slot held by a live attempt of another DAG run (two runs sharing a slot)
    with store.open() as s:
        s.ensure_schema()
        assert s.leases.acquire(JOB, SLOT, "other-run", 30) is not None
        s.execute("UPDATE resumable_checkpoints SET attempt = 1, dag_id = %s, task_id = %s, run_id = %s, "
                  "map_index = -1 WHERE job = %s AND slot = %s", (TI.dag_id, TI.task_id, "manual__1", JOB, SLOT))
        s.commit()
    run = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI),
                  options=Options(lease=30, lease_wait=0.3))
    # When this try waits for it, Then it gives up as before, and asked nothing of the holder
    with pytest.raises(LeaseBusy):
        run.run(_handler)
    with store.open() as s:
        assert s.checkpoints.load(JOB, SLOT).cancel_request is None


@pytest.mark.parametrize("status", ["running", "cancelled"])
def test_a_handover_left_on_the_row_does_not_stop_the_try_that_starts(store: Store, status: str) -> None:
    make_sink(store)
    # Given a handover asked of an older try that died before it read it (its lease lapsed)
    with store.open() as s:
        s.ensure_schema()
        assert s.leases.acquire(JOB, SLOT, "dead", 0.2) is not None
        s.execute("UPDATE resumable_checkpoints SET status = %s, cancel_request = 'handover' "
                  "WHERE job = %s AND slot = %s", (status, JOB, SLOT))
        s.commit()
    # When the newer try starts, Then it runs the slot to the end (the request was not its own)
    outcome = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI),
                      options=Options(lease=1)).run(_handler)
    assert outcome.checkpoint.status == "done" and outcome.checkpoint.cancel_request is None
    assert _sink_counts(store) == ([], ITEMS)
