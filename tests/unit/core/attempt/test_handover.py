"""Handover: a newer try of a task instance takes the slot from the older try that Airflow gave up
while that try's process still works (cut off from the API server, not from the checkpoint database)."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from airflow_resumable.core import Attempt, LeaseBusy, Options, Store
from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.identity import Identity
from support.lease_worker import JOB, SLOT, Worker, make_sink
from support.waits import wait_until

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


def _schema(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        s.commit()


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


class _LiveHolder:
    """An attempt on a thread whose chunks are short: it checkpoints every few milliseconds until
    ``finish`` is set, then once more and ends, so a handover asked of it meanwhile stops it at
    once (its next checkpoint reads the request)."""

    def __init__(self, store: Store, *, attempt: int, origin: Origin, lease: float):
        self.finish, self.checkpoints = threading.Event(), 0
        self.outcome: Any = None
        self.error: BaseException | None = None
        self._attempt = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=attempt, owner=f"try{attempt}",
                                                origin=origin), options=Options(lease=lease))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _handler(self, ctx: Any) -> int:
        i = ctx.position or 0
        while True:
            last = self.finish.wait(0.01)
            i += 1
            ctx.checkpoint(i, processed=i)
            self.checkpoints += 1
            if last:
                return i

    def _run(self) -> None:
        try:
            self.outcome = self._attempt.run(self._handler)
        except BaseException as exc:  # noqa: BLE001
            self.error = exc


@pytest.mark.parametrize("differs", ["dag_id", "task_id", "run_id", "map_index"])
def test_a_holder_of_another_task_instance_is_not_asked_to_hand_over(store: Store, differs: str) -> None:
    # Given the slot held by live try 1 of another task instance (two DAG runs, two tasks or two
    # mapped instances sharing a slot), checkpointing all along
    _schema(store)
    other = dataclasses.replace(TI, **{differs: 3 if differs == "map_index" else "other"})
    holder = _LiveHolder(store, attempt=1, origin=other, lease=30)
    wait_until(lambda: holder.checkpoints >= 2 or holder.error, "the holder's first checkpoints")
    # When try 2 of this task instance waits for the slot
    run = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI),
                  options=Options(lease=3, lease_wait=0.3))
    began = time.monotonic()
    with pytest.raises(LeaseBusy) as busy:
        run.run(lambda ctx: ctx.checkpoint(1, processed=1))
    waited = time.monotonic() - began
    seen = holder.checkpoints
    holder.finish.set()
    holder.thread.join(30)
    # Then it gave up after its lease_wait, as for any holder (a try that asked would wait ten of its
    # leases, 30 s, for the holder's next checkpoint), naming the holder
    assert waited < 5 and busy.value.holder == "try1", (waited, busy.value)
    # and the holder, asked nothing, checkpointed on through the wait and ran to its end
    assert holder.error is None and holder.outcome.checkpoint.status == "done", holder.error
    assert holder.checkpoints > seen >= 2
    with store.open() as s:
        history = [(r.attempt, r.outcome, r.stop_reason) for r in s.listings.history(JOB, SLOT)]
        row = s.checkpoints.load(JOB, SLOT)
    assert history == [(1, "done", None)], history
    assert (row.attempt, row.status, row.cancel_request, row.stop_reason) == (1, "done", None, None)


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
