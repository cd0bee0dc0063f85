"""A stop request (pause, cancel) reaches the running attempt with its next checkpoint: the
checkpoint's own statement returns the request pending on the row, so a run of fast chunks stops
at the first checkpoint written after the request, not at its lease's next heartbeat.

Every attempt here has a lease of ten minutes, so its keeper never heartbeats during the test:
only the checkpoint can carry the request. Given / When / Then, against both stores.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Cancelled, Options, Paused, Store, control
from airflow_resumable.core.model.errors import Cancelled as CancelledError
from airflow_resumable.core.model.identity import Identity
from support.checkpoint_stops import ASK_AT, DAY, JOB, SLOT, FastItems, attempt, row
from support.waits import wait_until

ASK = {"pause": (control.pause, Paused, "paused"), "cancel": (control.cancel, Cancelled, "cancelled")}


@pytest.mark.parametrize("action", sorted(ASK))
@pytest.mark.parametrize("asker", ["handler", "thread"])
def test_a_stop_asked_after_checkpoint_k_stops_the_run_at_checkpoint_k_plus_1_without_a_heartbeat(
    store: Store, action: str, asker: str,
) -> None:
    ask, raised, status = ASK[action]
    asked = threading.Event()
    a = attempt(store)

    def after(ctx: Any, i: int) -> None:
        if i != ASK_AT:
            return
        if asker == "handler":  # Given the handler itself asks, through the control API, after checkpoint k
            ask(store, JOB, SLOT, by="erin")
        else:  # or a person's thread does, while the handler waits for it before chunk k+1
            threading.Thread(target=lambda: (ask(store, JOB, SLOT, by="erin"), asked.set()), daemon=True).start()
            wait_until(asked.is_set, "the request on the row")

    work = FastItems(1000, after)
    # When the run goes on with its fast chunks
    with pytest.raises(raised) as stopped:
        a.run(work)
    # Then it stopped at checkpoint k+1: chunk k+1 ran and was saved, no chunk after it
    assert work.seen[-1] == ASK_AT and len(work.seen) == ASK_AT + 1
    stored = row(store)
    assert (stored.status, stored.position, stored.processed) == (status, ASK_AT + 1, ASK_AT + 1)
    # with the message the heartbeat's delivery gives, naming who asked
    assert stopped.value.message == f"{action} requested by erin"
    # and no heartbeat carried it
    assert a.keeper is not None and a.keeper.beats == 0
    if action == "cancel":
        assert (stored.stop_reason, stored.last_error) == ("requested", "cancel requested by erin")
    else:
        assert stored.stop_reason == "paused" and stored.request is None


def test_a_handler_writing_in_the_checkpoint_s_transaction_stops_at_checkpoint_k_plus_1_with_its_writes(
    store: Store,
) -> None:
    # Given a handler whose chunks write to a sink in the checkpoint's transaction (ctx.transaction())
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        s.execute("CREATE TABLE sink (item INTEGER PRIMARY KEY)")

    def after(ctx: Any, i: int) -> None:
        if i == ASK_AT:
            control.cancel(store, JOB, SLOT, by="erin")

    work = FastItems(1000, after, transactional=True)
    # When a cancel is asked after checkpoint k
    with pytest.raises(CancelledError) as stopped:
        attempt(store).run(work)
    # Then the run stopped at checkpoint k+1, named who asked, and kept exactly the saved chunks' writes
    assert stopped.value.message == "cancel requested by erin"
    assert (row(store).status, row(store).position) == ("cancelled", ASK_AT + 1)
    with store.open(autocommit=True) as s:
        items = [r[0] for r in s.execute("SELECT item FROM sink ORDER BY item").fetchall()]
    assert items == list(range(ASK_AT + 1))


@pytest.mark.parametrize("action", sorted(ASK))
def test_a_pipelined_run_reads_the_request_with_the_checkpoint_in_flight_and_stops_one_checkpoint_later(
    store: Store, action: str,
) -> None:
    ask, raised, status = ASK[action]
    a = attempt(store, pipeline_checkpoints=True)

    def after(ctx: Any, i: int) -> None:
        if i == ASK_AT:  # Given a request asked after checkpoint k was handed to the writer
            ask(store, JOB, SLOT, by="erin")

    work = FastItems(1000, after)
    # When the run goes on
    with pytest.raises(raised) as stopped:
        a.run(work)
    # Then checkpoint k+1's statement read it, and the run stopped once that result was collected:
    # at checkpoint k+2 at the latest (k+1 when the writer thread answered before the boundary's
    # check, or checkpoint k's statement, sent without waiting, ran after the request), the
    # checkpoint in flight saved first
    stored = row(store)
    assert ASK_AT + 1 <= stored.position <= ASK_AT + 2 and stored.position == len(work.seen)
    assert (stored.status, stored.processed) == (status, stored.position)
    assert stopped.value.message == f"{action} requested by erin"
    assert a.keeper is not None and a.keeper.beats == 0


def test_a_cancel_from_a_newer_run_reaches_the_holder_at_its_next_checkpoint(store: Store) -> None:
    # Given a request a program writes on the row (a newer run superseding this one)
    def after(ctx: Any, i: int) -> None:
        if i == ASK_AT:
            with store.open(autocommit=True) as s:
                assert s.requests.cancel(JOB, SLOT, "superseded")

    work = FastItems(1000, after)
    # When the run goes on
    with pytest.raises(CancelledError) as stopped:
        attempt(store).run(work)
    # Then it stops at the next checkpoint, with the reason the row gives
    assert stopped.value.reason == "superseded"
    assert (row(store).status, row(store).position) == ("cancelled", ASK_AT + 1)


def test_a_long_chunk_still_learns_of_a_request_from_its_lease_s_heartbeat(store: Store) -> None:
    # Given a run whose heartbeat comes every 50 ms, and a chunk that waits on its signal for up to 30 s
    a = Attempt(
        store, Identity(job=JOB, slot=SLOT, attempt=1, owner="owner-1"), options=Options(lease=3.0), heartbeat=0.05,
    )
    woke: list[bool] = []

    def handler(ctx: Any) -> None:
        for i in range(1, 100):
            if i == ASK_AT + 1:
                control.cancel(store, JOB, SLOT, by="erin")
                woke.append(ctx.signal.wait(30))  # no checkpoint comes before this wait ends
            ctx.checkpoint(i, processed=i)

    # When a cancel is asked inside that chunk
    with pytest.raises(CancelledError) as stopped:
        a.run(handler)
    # Then the heartbeat woke the chunk's wait, and the run stopped at that chunk's checkpoint
    assert woke == [True] and stopped.value.message == "cancel requested by erin"
    assert (row(store).status, row(store).position) == ("cancelled", ASK_AT + 1)


def test_a_dag_run_cancelled_after_checkpoint_k_fails_at_checkpoint_k_plus_1(
    checkpoints: Store, run_dag: Any, tmp_path: Any,
) -> None:
    # Given a task with fast chunks that asks, through the control API by connection id, for a
    # cancel of its own slot right after checkpoint k (its lease of ten minutes never heartbeats here)
    log = tmp_path / "seen.db"
    # When the DAG runs under dag.test()
    run = run_dag("rt_stop_at_checkpoint", conf={"ask_at": ASK_AT, "seen": str(log)}, logical_date=DAY)
    # Then the task failed at checkpoint k+1, having run chunk k+1 and nothing after it
    assert str(run.get_task_instance("work").state) == "failed"
    with checkpoints.open() as s:
        stored = s.checkpoints.load("rt_stop_at_checkpoint.work", DAY.isoformat())
    assert (stored.status, stored.position, stored.last_error) == ("cancelled", ASK_AT + 1, "cancel requested by erin")
    with sqlite3.connect(log) as db:
        assert [i for (i,) in db.execute("SELECT item FROM seen ORDER BY rowid")] == list(range(ASK_AT + 1))
