"""Async handlers in real Airflow DAG runs (dag.test()), against both checkpoint stores: a timeout
cuts a 60 s await within seconds, and the retry resumes from the last checkpoint."""

from __future__ import annotations

import sqlite3
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core.stores import Store
from support.xcoms import xcom

DAY = datetime(2026, 3, 1, tzinfo=timezone.utc)
SLOT = DAY.isoformat()


def seen(path: Path) -> list[tuple[int, int]]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT item, attempt FROM seen ORDER BY rowid").fetchall()


def row_of(store: Store, job: str) -> Any:
    with store.open() as s:
        return s.checkpoints.load(job, SLOT)


@pytest.mark.parametrize("dag_id", ["rt_async_operator", "rt_async_taskflow"])
def test_an_async_handler_cut_by_its_timeout_mid_await_resumes_on_the_retry(
        checkpoints: Store, run_dag, tmp_path: Path, dag_id: str) -> None:
    # Given an async handler that awaits 60 s after its checkpoint at 10 on try 1, with a 1.5 s timeout
    log = tmp_path / "seen.db"
    began = time.monotonic()
    # When the DAG runs
    run = run_dag(dag_id, conf={"items": 30, "chunk": 5, "hang": 10, "seen": str(log)}, logical_date=DAY)
    # Then the await was cut (the run took seconds, not a minute), the retry resumed at 10, and it succeeded
    assert str(run.state) == "success" and time.monotonic() - began < 45
    events = seen(log)
    assert [i for i, a in events if a == 1] == list(range(10))
    assert [i for i, a in events if a == 2] == list(range(10, 30))
    task_id = "work" if dag_id == "rt_async_operator" else "export"
    stored = row_of(checkpoints, f"{dag_id}.{task_id}")
    assert (stored.status, stored.processed, stored.attempts) == ("done", 30, 2)
    assert xcom(run, task_id) == {"sum": sum(range(30))}


def test_a_chunked_operator_with_async_read_and_process_resumes_after_its_timeout(
        checkpoints: Store, run_dag, tmp_path: Path) -> None:
    # Given async read/process, process hanging 60 s on try 1 at the chunk starting at 8
    log = tmp_path / "seen.db"
    # When the DAG runs
    run = run_dag("rt_async_chunked", conf={"items": 20, "hang": 8, "seen": str(log)}, logical_date=DAY)
    # Then the retry resumed after the last saved chunk (7) and every item was processed
    assert str(run.state) == "success"
    events = seen(log)
    assert [i for i, a in events if a == 1] == list(range(12))
    assert [i for i, a in events if a == 2] == list(range(8, 20))
    stored = row_of(checkpoints, "rt_async_chunked.work")
    assert (stored.status, stored.processed, stored.position) == ("done", 20, 19)
