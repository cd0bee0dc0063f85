"""Pause, throttle and time slices in real DAG runs through dag.test(), which runs the trigger in
line: the task defers, and continues in the same try. (The real triggerer, with a pool of one, is
in tests/integration/test_scheduler.py.)"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable import control
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import Store
from support.waits import wait_until
from support.xcoms import xcom

DAY = datetime(2026, 3, 2, tzinfo=timezone.utc)
SLOT = DAY.isoformat()


def row_of(store: Store, job: str) -> Any:
    with store.open() as s:
        s.ensure_schema()  # the test may look before the task created the tables
        return s.checkpoints.load(job, SLOT)


def history_of(store: Store, job: str) -> list[tuple[str, str | None, int]]:
    with store.open() as s:
        return [(r.outcome, r.requested_by, r.attempt) for r in s.listings.history(job, SLOT)]


def seen(path: Path) -> list[int]:
    import sqlite3

    with sqlite3.connect(path) as db:
        return [i for (i,) in db.execute("SELECT item FROM seen ORDER BY rowid")]


def test_a_paused_task_defers_and_resume_continues_it_in_the_same_try(checkpoints: Store, run_dag, tmp_path: Path) -> None:
    job, log = "rt_pause.work", tmp_path / "seen.db"
    steps: dict[str, Any] = {}

    def person() -> None:  # pauses the run once it made progress, then resumes it
        try:
            wait_until(lambda: (r := row_of(checkpoints, job)) is not None and r.processed >= 10, "progress", timeout=60)
            control.pause(job, SLOT, by="alice")
            steps["paused"] = wait_until(lambda: (r := row_of(checkpoints, job)).status == "paused" and r, "the pause", timeout=60)
            control.resume(job, SLOT, by="bob")
        except BaseException as exc:  # surfaced by the assertions below
            steps["error"] = exc

    helper = threading.Thread(target=person)
    helper.start()
    run = run_dag("rt_pause", conf={"items": 60, "chunk": 5, "sleep": 0.3, "seen": str(log)}, logical_date=DAY)
    helper.join(30)
    assert "error" not in steps, steps.get("error")
    paused = steps["paused"]
    assert paused.stop_reason == "paused" and paused.lease_owner is None and 10 <= paused.processed < 60
    assert str(run.state) == "success"
    ti = run.get_task_instance("work")
    assert ti.try_number == 1  # the pause used no retry
    assert seen(log) == list(range(60))  # each item once, across the pause
    done = row_of(checkpoints, job)
    assert (done.status, done.processed, done.attempt, done.resumed_from) == ("done", 60, 1, paused.position)
    assert history_of(checkpoints, job) == [
        ("paused", None, 1), ("pause_requested", "alice", 1), ("resume_requested", "bob", 1), ("done", None, 1),
    ]


def test_a_task_cancelled_while_paused_fails_without_a_retry_and_keeps_its_checkpoint(
    checkpoints: Store, run_dag, tmp_path: Path
) -> None:
    job = "rt_pause.work"

    def person() -> None:
        wait_until(lambda: (r := row_of(checkpoints, job)) is not None and r.processed >= 10, "progress", timeout=60)
        control.pause(job, SLOT, by="alice")
        wait_until(lambda: row_of(checkpoints, job).status == "paused", "the pause", timeout=60)
        control.cancel(job, SLOT, by="carol")

    helper = threading.Thread(target=person)
    helper.start()
    run = run_dag("rt_pause", conf={"items": 60, "chunk": 5, "sleep": 0.3}, logical_date=DAY)
    helper.join(30)
    assert str(run.state) == "failed"
    row = row_of(checkpoints, job)
    assert (row.status, row.stop_reason, row.last_error) == ("cancelled", "requested", "cancelled by carol")
    assert 10 <= row.processed < 60 and run.get_task_instance("work").try_number == 1


def test_a_long_throttle_wait_defers_twice_and_the_task_finishes_in_one_try(
    checkpoints: Store, run_dag, tmp_path: Path
) -> None:
    log = tmp_path / "seen.db"
    run = run_dag("rt_throttle", conf={"items": 30, "chunk": 5, "seen": str(log), "throttle_wait": 1.0},
                  logical_date=DAY)
    assert str(run.state) == "success" and run.get_task_instance("work").try_number == 1
    assert seen(log) == list(range(30))
    outcomes = [o for o, _, _ in history_of(checkpoints, "rt_throttle.work")]
    assert outcomes == ["paused", "paused", "done"]
    assert row_of(checkpoints, "rt_throttle.work").stop_reason is None


def test_max_runtime_slices_the_run_and_each_slice_continues_where_the_last_stopped(
    checkpoints: Store, run_dag, tmp_path: Path
) -> None:
    log = tmp_path / "seen.db"
    run = run_dag("rt_slices", conf={"items": 20, "chunk": 2, "sleep": 0.1, "seen": str(log)}, logical_date=DAY)
    assert str(run.state) == "success" and run.get_task_instance("work").try_number == 1
    assert seen(log) == list(range(20))
    outcomes = [o for o, _, _ in history_of(checkpoints, "rt_slices.work")]
    assert outcomes.count("paused") >= 2 and outcomes[-1] == "done"


def test_a_taskflow_task_defers_between_slices_and_returns_its_value(checkpoints: Store, run_dag, tmp_path: Path) -> None:
    log = tmp_path / "seen.db"
    run = run_dag("rt_taskflow_slices", conf={"seen": str(log)}, logical_date=DAY)
    assert str(run.state) == "success" and seen(log) == list(range(20))
    assert "paused" in [o for o, _, _ in history_of(checkpoints, "rt_taskflow_slices.sliced")]
    assert xcom(run, "sliced") == {"n": 20}


def test_the_cooperative_timeout_counts_running_time_across_the_slices_of_a_try(
    checkpoints: Store, run_dag, tmp_path: Path
) -> None:
    # 80 items at 0.1 s need 8 s of running; each slice runs 0.3 s, the try may run 2 s in all
    run = run_dag("rt_slices_timeout", conf={"items": 80, "chunk": 1, "sleep": 0.1}, logical_date=DAY)
    assert str(run.state) == "failed"
    row = row_of(checkpoints, "rt_slices_timeout.work")
    assert (row.status, row.stop_reason) == ("cancelled", "timeout") and row.processed < 80
    outcomes = [o for o, _, _ in history_of(checkpoints, "rt_slices_timeout.work")]
    assert outcomes.count("paused") >= 2 and outcomes[-1] == "cancelled"


def test_the_resume_trigger_waits_for_airflow_to_settle_then_fires_with_the_latest_state(
    checkpoints: Store, tmp_path: Path
) -> None:
    import asyncio

    from airflow_resumable.core import Attempt, Options, Paused
    from airflow_resumable.triggers.resume import SlotResumeTrigger

    job = "settle.work"

    def pause_at_once(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        raise Paused("paused", "by the test")

    with pytest.raises(Paused):
        Attempt(checkpoints, Identity(job=job, slot=SLOT, attempt=1, owner="o"), options=Options()).run(pause_at_once)
    control.resume(job, SLOT, by="early")  # due at once, but within the settle time

    async def first_event(settle: float) -> tuple[dict[str, Any], float]:
        trigger = SlotResumeTrigger(conn_id="resumable_default", job=job, slot=SLOT, poll=0.05, ran=2.5,
                                    settle=settle)
        started = time.monotonic()
        async for event in trigger.run():
            return event.payload, time.monotonic() - started
        raise AssertionError("no event")

    payload, waited = asyncio.run(first_event(0.6))
    assert payload["event"] == "resumed" and payload["ran"] == 2.5 and waited >= 0.6
    # A cancel made while it settles is what it reports
    with checkpoints.open() as s:
        s.execute("UPDATE resumable_checkpoints SET request = NULL WHERE job = %s", (job,))
        s.commit()

    async def cancelled_while_settling() -> dict[str, Any]:
        task = asyncio.ensure_future(first_event(1.0))
        await asyncio.sleep(0.2)
        await asyncio.get_running_loop().run_in_executor(None, lambda: control.cancel(job, SLOT, by="late"))
        return (await task)[0]

    assert asyncio.run(cancelled_while_settling())["event"] == "cancelled"
