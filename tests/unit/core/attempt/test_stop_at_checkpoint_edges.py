"""A stop request read by the checkpoint's own statement, at its edges: a row edited by hand, a
request withdrawn or replaced before the holder saw it, the chunk's writes in the checkpoint's
transaction across a pause and a real resume (with the "who asked" read failing), psycopg 3, and a
paused task that defers under ``dag.test()`` and continues when resumed.

Every attempt has a lease of ten minutes, so only the checkpoint can carry the request.
Given / When / Then, against both stores.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Cancelled, LeaseLost, Options, Paused, Store, control
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import requests as request_store
from support.checkpoint_stops import (
    ASK_AT,
    DAY,
    JOB,
    LEASE,
    SLOT,
    FastItems,
    attempt,
    row,
)
from support.waits import wait_until

N = 20


def edit_row(store: Store, sets: str) -> None:
    with store.open(autocommit=True) as s:
        s.execute(f"UPDATE resumable_checkpoints SET {sets}")


def make_sink(store: Store) -> None:
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        s.execute("CREATE TABLE sink (item INTEGER PRIMARY KEY)")


def sink(store: Store) -> list[int]:
    with store.open(autocommit=True) as s:
        return [r[0] for r in s.execute("SELECT item FROM sink ORDER BY item").fetchall()]


def at(k: int, do: Any) -> Any:
    return lambda ctx, i: do() if i == k else None


@pytest.mark.parametrize("value", ["bogus", "PAUSE", "user"])
def test_a_cancel_request_edited_by_hand_to_an_unknown_value_stops_the_run_as_a_cancel_naming_that_value(
    store: Store, value: str,
) -> None:
    # Given a holder whose row gets a stop request no version of the product writes
    work = FastItems(N, at(ASK_AT, lambda: edit_row(store, f"cancel_request = '{value}'")))
    # When the run goes on
    with pytest.raises(Cancelled) as stopped:
        attempt(store).run(work)
    # Then it stops at the next checkpoint as a cancel with that reason, the row saying so
    message = f"{value}: requested through the checkpoint row"
    assert (stopped.value.reason, stopped.value.message) == (value, message)
    stored = row(store)
    assert (stored.status, stored.position, stored.stop_reason, stored.last_error) == (
        "cancelled", ASK_AT + 1, value, message)
    assert stored.lease_owner is None and stored.cancel_request is None


@pytest.mark.parametrize("sets", ["cancel_request = ''", "request = ''", "request = 'PAUSE'", "request = 'restart'"])
def test_an_empty_or_unknown_request_edited_by_hand_is_not_a_stop_and_the_run_finishes(store: Store, sets: str) -> None:
    # Given a row edited by hand to an empty or unknown request
    work = FastItems(N, at(ASK_AT, lambda: edit_row(store, sets)))
    # When the run goes on, Then it finishes, and the row ends done with nothing pending
    attempt(store).run(work)
    stored = row(store)
    assert (stored.status, stored.position, stored.cancel_request, stored.request) == ("done", N, None, None)


def test_a_cancel_request_edited_by_hand_to_lease_lost_ends_the_slot_as_a_cancel_not_as_a_lost_lease(
    store: Store,
) -> None:
    # Given a holder whose row gets cancel_request 'lease_lost' by hand (the signal's own reason
    # for a lost lease: a checkpoint that returned it was written, so the lease is this attempt's)
    work = FastItems(N, at(ASK_AT, lambda: edit_row(store, "cancel_request = 'lease_lost'")))
    # When the run goes on
    with pytest.raises(Cancelled) as stopped:
        attempt(store).run(work)
    # Then it stops as the next attempt would have (a cancel with that reason), and the slot is
    # not left "running" under a lease nobody renews
    assert not isinstance(stopped.value, LeaseLost)
    stored = row(store)
    assert (stored.status, stored.lease_owner, stored.cancel_request) == ("cancelled", None, None)


def test_a_pause_withdrawn_by_resume_before_the_next_checkpoint_does_not_stop_the_run(store: Store) -> None:
    # Given a pause and then a resume, both asked between two checkpoints
    def ask() -> None:
        control.pause(store, JOB, SLOT, by="erin")
        control.resume(store, JOB, SLOT, by="erin")

    work = FastItems(N, at(ASK_AT, ask))
    # When the run goes on, Then no checkpoint returns a stop: it finishes with nothing pending
    attempt(store).run(work)
    stored = row(store)
    assert (stored.status, stored.position, stored.request, stored.cancel_request) == ("done", N, None, None)


def test_a_pause_then_a_cancel_before_the_next_checkpoint_stops_the_run_as_the_cancel_of_who_cancelled(
    store: Store,
) -> None:
    # Given a pause by erin and then a cancel by frank, both between two checkpoints
    def ask() -> None:
        control.pause(store, JOB, SLOT, by="erin")
        control.cancel(store, JOB, SLOT, by="frank")

    work = FastItems(N, at(ASK_AT, ask))
    # When the run goes on, Then the next checkpoint stops it as frank's cancel
    with pytest.raises(Cancelled) as stopped:
        attempt(store).run(work)
    assert not isinstance(stopped.value, Paused) and stopped.value.message == "cancel requested by frank"
    stored = row(store)
    assert (stored.status, stored.position, stored.stop_reason) == ("cancelled", ASK_AT + 1, "requested")


@pytest.mark.parametrize("hiccup", ["none", "open", "read"])
def test_a_pause_in_a_transactional_chunk_keeps_each_write_once_across_a_resume_even_when_who_asked_cannot_be_read(
    store: Store, hiccup: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given chunks that write to a sink in the checkpoint's transaction, and a pause after
    # checkpoint k, with the read of who asked failing (no connection, or the read itself)
    make_sink(store)

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the database hiccuped")

    def ask() -> None:
        control.pause(store, JOB, SLOT, by="erin")
        if hiccup == "open":
            monkeypatch.setattr(type(store), "open", boom)
        elif hiccup == "read":
            monkeypatch.setattr(request_store.Requests, "requested_by", boom)

    # When the run goes on
    with pytest.raises(Paused) as stopped:
        attempt(store).run(FastItems(N, at(ASK_AT, ask), transactional=True))
    monkeypatch.undo()
    # Then it paused at checkpoint k+1 all the same, naming erin only when it could read her name
    named = "pause requested by erin"
    assert stopped.value.message == (named if hiccup == "none" else
                                     "pause requested through the control API (CLI, UI or REST)")
    assert (row(store).status, row(store).position) == ("paused", ASK_AT + 1)
    assert sink(store) == list(range(ASK_AT + 1))
    # and once resumed, a new attempt finishes with every item written exactly once
    control.resume(store, JOB, SLOT, by="erin")
    Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="owner-2"), options=Options(lease=LEASE)).run(
        FastItems(N, lambda ctx, i: None, transactional=True))
    assert (row(store).status, sink(store)) == ("done", list(range(N)))


@pytest.mark.parametrize("pipelined", [False, True], ids=["plain", "pipelined"])
def test_a_store_connected_with_psycopg3_returns_the_request_with_the_checkpoint(
    pg_params: dict[str, Any], pipelined: bool,
) -> None:
    import psycopg

    from airflow_resumable.core.stores.postgres import PostgresStore

    # Given a PostgreSQL store whose connections are psycopg 3's
    store = PostgresStore.from_connect(lambda: psycopg.connect(**pg_params))
    with store.open() as s:
        s.ensure_schema()
    a = attempt(store, pipeline_checkpoints=pipelined)
    # When a cancel is asked after checkpoint k
    with pytest.raises(Cancelled) as stopped:
        a.run(FastItems(1000, at(ASK_AT, lambda: control.cancel(store, JOB, SLOT, by="erin"))))
    # Then the checkpoint's RETURNING carried it: stopped one checkpoint later (two pipelined), no heartbeat
    assert stopped.value.message == "cancel requested by erin"
    assert row(store).status == "cancelled"
    assert ASK_AT + 1 <= row(store).position <= ASK_AT + 1 + pipelined
    assert a.keeper is not None and a.keeper.beats == 0


def test_a_task_paused_at_its_checkpoint_defers_and_a_resume_continues_it_in_the_same_try(
    checkpoints: Store, run_dag: Any, tmp_path: Any,
) -> None:
    import sqlite3

    # Given a task (lease of ten minutes: no heartbeat) that asks for its own pause after checkpoint k,
    # and a person who resumes it once the row says paused
    job, log, resumed = "rt_stop_at_checkpoint.work", tmp_path / "seen.db", []

    def person() -> None:
        def paused() -> bool:
            with checkpoints.open() as s:
                s.ensure_schema()
                r = s.checkpoints.load(job, DAY.isoformat())
            return r is not None and r.status == "paused"
        wait_until(paused, "the pause", timeout=60)
        resumed.append(control.resume(checkpoints, job, DAY.isoformat(), by="bob").position)

    helper = threading.Thread(target=person, daemon=True)
    helper.start()
    # When the DAG runs under dag.test() (which runs the trigger in line)
    run = run_dag("rt_stop_at_checkpoint", conf={"ask_at": ASK_AT, "items": 30, "action": "pause", "seen": str(log)},
                  logical_date=DAY)
    helper.join(30)
    # Then it paused at checkpoint k+1, and the resume finished it in the same try, each item once
    assert resumed == [ASK_AT + 1]
    assert str(run.state) == "success" and run.get_task_instance("work").try_number == 1
    with sqlite3.connect(log) as db:
        assert [i for (i,) in db.execute("SELECT item FROM seen ORDER BY rowid")] == list(range(30))
    with checkpoints.open() as s:
        done = s.checkpoints.load(job, DAY.isoformat())
    assert done is not None
    assert (done.status, done.processed, done.resumed_from) == ("done", 30, ASK_AT + 1)
