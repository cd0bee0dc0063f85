"""Async handlers in real Airflow DAG runs (dag.test()), against both checkpoint stores: a timeout
cuts a 60 s await within seconds, and the retry resumes from the last checkpoint. And the async
example's handler (dags/async_export.py) proven by the test kit."""

from __future__ import annotations

import functools
import importlib
import sqlite3
import sys
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core.stores import Store
from support.xcoms import xcom

DAGS_DIR = Path(__file__).parent.parent / "dags"
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
    # When the DAG runs
    run = run_dag(dag_id, conf={"items": 30, "chunk": 5, "hang": 10, "seen": str(log)}, logical_date=DAY)
    # Then the await was cut (try 1 ended by its timeout, well before the 60 s await could have ended), the
    # retry resumed at 10, and it succeeded
    assert str(run.state) == "success"
    task_id = "work" if dag_id == "rt_async_operator" else "export"
    with checkpoints.open() as s:
        first = s.listings.history(f"{dag_id}.{task_id}", SLOT)[0]
    assert (first.attempt, first.stop_reason) == (1, "timeout")
    assert first.ended_at is not None and first.started_at is not None
    assert (first.ended_at - first.started_at).total_seconds() < 60
    events = seen(log)
    assert [i for i, a in events if a == 1] == list(range(10))
    assert [i for i, a in events if a == 2] == list(range(10, 30))
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


@pytest.mark.timeout(420)  # a hang ends the test with every thread's stack (the kit's runs take about a minute)
def test_the_async_export_is_resumable_by_the_test_kit_under_every_interruption(
        airflow_home: Path, tmp_path: Path) -> None:
    """The kit interrupts the async export (its own HTTP service, 50 requests at once through
    ctx.map) at checkpoints by every kind, a real process death included: the same customers end in
    the API's sink as in the uninterrupted run."""
    from airflow_resumable.testing import ALL_INTERRUPTIONS, check_resumable

    # Given the example's handler against its local service, 150 customers, its sink a file
    if str(DAGS_DIR) not in sys.path:
        sys.path.append(str(DAGS_DIR))  # importable by name: process_death imports it in a new process
    sys.modules.pop("async_export", None)
    module = importlib.import_module("async_export")
    sink = tmp_path / "sink.db"

    def snapshot() -> Any:
        if not sink.exists():
            return []
        with closing(sqlite3.connect(sink)) as db:
            return db.execute("SELECT id, name FROM exported ORDER BY id").fetchall()

    def reset() -> None:
        sink.unlink(missing_ok=True)

    handler = functools.partial(module.export_customers, latency_ms=0, customers=150, sink=str(sink))
    # When the kit interrupts it at its first and last checkpoints by every kind (the requests end in
    # any order, so the mark is saved 2 or 3 times: the first and the last, whichever they are)
    report = check_resumable(handler, snapshot=snapshot, reset=reset, samples=2, seed=1)
    # Then every interrupted run ended with the uninterrupted run's result and sink
    report.assert_ok()
    assert {t.interruption for t in report.trials} == set(ALL_INTERRUPTIONS)
    assert report.points == [1, report.checkpoints] and report.checkpoints >= 2
    assert len(report.snapshot) == 150 and report.result == {"exported": 150}
