"""Overlap policy between runs of the same job in different slots, in real DAG runs.

The older run is an attempt of the same job in another process (a run of yesterday's slot still
going); the newer run is a DAG run through dag.test().
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import Store
from support.lease_worker import Worker
from support.paths import ROOT

JOB = "shared-job"
NEW = datetime(2026, 6, 2, tzinfo=timezone.utc)


def older_run(store: Store, *, items: int, chunk_s: float, gate: Path | None = None) -> Worker:
    """Yesterday's slot, running (it announces its first checkpoint before we go on). With a
    ``gate``, it holds after each checkpoint until that file exists."""
    with store.open() as s:
        s.ensure_schema()
        s._execute("CREATE TABLE IF NOT EXISTS sink (item INTEGER NOT NULL, owner TEXT NOT NULL)")
        s.commit()
    worker = Worker(store, attempt=1, items=items, chunk=1, chunk_s=chunk_s, lease=1.5, job=JOB,
                    slot="2026-06-01T00:00:00+00:00", gate=gate)
    worker.wait_checkpoints(1)
    return worker


def newer_row(store: Store):
    with store.open() as s:
        return s.checkpoints.load(JOB, NEW.isoformat())


def test_skip_ends_the_newer_run_as_skipped_and_names_the_other_slot(
    checkpoints: Store, run_dag, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The older run holds after its first checkpoint (a gate never opened) for as long as the newer
    # run takes to start, however loaded the machine
    older = older_run(checkpoints, items=400, chunk_s=0.05, gate=tmp_path / "never")
    try:
        run = run_dag("rt_overlap_skip", conf={"items": 5}, logical_date=NEW)
    finally:
        older.proc.kill()
    ti = run.get_task_instance("work")
    assert str(ti.state) == "skipped"
    out = "".join(capfd.readouterr())
    assert "slot 2026-06-01T00:00:00+00:00 of this job began first, at " in out
    assert newer_row(checkpoints) is None, "a skipped run leaves no checkpoint behind"


def test_allow_runs_both_slots_at_once(checkpoints: Store, run_dag, tmp_path: Path) -> None:
    older = older_run(checkpoints, items=400, chunk_s=0.05, gate=tmp_path / "never")
    try:
        run = run_dag("rt_overlap_allow", conf={"items": 5}, logical_date=NEW)
        assert older.proc.poll() is None, "the older run was still going"
    finally:
        older.proc.kill()
    assert str(run.state) == "success"
    assert newer_row(checkpoints).status == "done"


def reschedules_of(dag_id: str, since: datetime, task_id: str = "work") -> int:
    """How many times Airflow rescheduled the task since ``since`` (any run of ``dag_id``)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session

    with create_session() as session:
        return (
            session.query(TaskReschedule)
            .join(TaskInstance, TaskInstance.id == TaskReschedule.ti_id)
            .filter(TaskInstance.dag_id == dag_id, TaskInstance.task_id == task_id,
                    TaskReschedule.start_date >= since)
            .count()
        )


def test_wait_reschedules_without_using_a_retry_until_the_older_run_ends(
    checkpoints: Store, run_dag, tmp_path: Path
) -> None:
    # The older run holds until the newer one has been rescheduled at least once: the test does not
    # depend on how long dag.test() takes to reach the task on a loaded machine.
    gate = tmp_path / "older-may-finish"
    older = older_run(checkpoints, items=3, chunk_s=0.05, gate=gate)
    # A first query on this thread configures SQLAlchemy's mappers before the opener's thread
    # queries (configuring them on two threads at once can deadlock).
    since = datetime.now(timezone.utc)
    assert reschedules_of("rt_overlap_wait", since) == 0
    opener = threading.Thread(target=_open_after_a_reschedule, args=(gate, "rt_overlap_wait", since), daemon=True)
    opener.start()
    try:
        run = run_dag("rt_overlap_wait", conf={"items": 5}, logical_date=NEW)
    finally:
        gate.touch()
        opener.join(5)
    assert older.stopped()["error"] is None, "the older run finished undisturbed"
    assert str(run.state) == "success"
    ti = run.get_task_instance("work")
    assert ti.try_number == 1, "waiting used no retry"
    assert reschedules_of("rt_overlap_wait", since) >= 1
    row = newer_row(checkpoints)
    older_row = _load(checkpoints, "2026-06-01T00:00:00+00:00")
    assert row.status == "done" and row.started_at is not None
    assert older_row.status == "done"
    assert row.started_at >= older_row.finished_at, "the newer run started only after the older one ended"


def _open_after_a_reschedule(gate: Path, dag_id: str, since: datetime, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not gate.exists() and time.monotonic() < deadline:
        if reschedules_of(dag_id, since) >= 1:
            break
        time.sleep(0.05)
    gate.touch()


def _load(store: Store, slot: str):
    with store.open() as s:
        return s.checkpoints.load(JOB, slot)


def test_replace_stops_the_older_run_at_a_chunk_boundary_and_proceeds(checkpoints: Store, run_dag) -> None:
    older = older_run(checkpoints, items=4000, chunk_s=0.05)
    run = run_dag("rt_overlap_replace", conf={"items": 5}, logical_date=NEW)
    stop = older.stopped(timeout=30)
    assert stop["reason"] == "superseded", stop
    assert str(run.state) == "success"
    with checkpoints.open() as s:
        old = s.checkpoints.load(JOB, "2026-06-01T00:00:00+00:00")
        cur = s.conn.cursor()
        cur.execute("SELECT count(*) FROM sink")
        written = cur.fetchone()[0]
    assert (old.status, old.stop_reason) == ("cancelled", "superseded")
    assert old.position == written, "its checkpoint is intact and resumable"


def test_an_older_run_retrying_is_not_skipped_by_a_run_that_started_in_its_retry_gap(checkpoints: Store) -> None:
    """skip judges by when each *run* began: a retry of yesterday's slot is still the older run."""
    from airflow_resumable.core import Attempt, Options

    def fail_after_one_chunk(ctx) -> None:
        ctx.checkpoint(1, processed=1)
        raise RuntimeError("crash")

    old_slot = "2026-06-01T00:00:00+00:00"
    with checkpoints.open() as s:
        s.ensure_schema()
        s._execute("CREATE TABLE IF NOT EXISTS sink (item INTEGER NOT NULL, owner TEXT NOT NULL)")
        s.commit()
    with pytest.raises(RuntimeError):
        Attempt(
            checkpoints, Identity(job=JOB, slot=old_slot, attempt=1, owner="old-1"),
            options=Options(overlap="skip", lease=1.5),
        ).run(fail_after_one_chunk)
    # meanwhile today's run starts (nothing was live) and is still running
    newer = Worker(checkpoints, attempt=1, items=400, chunk=1, chunk_s=0.05, lease=1.5, job=JOB, slot=NEW.isoformat())
    try:
        newer.wait_checkpoints(1)
        outcome = Attempt(
            checkpoints, Identity(job=JOB, slot=old_slot, attempt=2, owner="old-2"),
            options=Options(overlap="skip", lease=1.5),
        ).run(lambda ctx: ctx.checkpoint(2, processed=2))
    finally:
        newer.proc.kill()
    assert outcome.checkpoint.status == "done" and outcome.resumed_from == 1


def test_skip_names_the_run_that_began_first_its_slot_and_start_in_the_log_and_for_the_tab(
    checkpoints: Store, run_dag, airflow_home: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Two real DAG runs: a manual one (no logical date: its slot is its run id, which sorts after
    any date) starts first and runs; a scheduled-style one (slot: a date) then meets it and is
    skipped. The log's main part and the Checkpoint tab name the manual run, its slot and start."""
    import json
    import os
    import subprocess
    import sys

    from airflow_resumable.plugins.api import overlap_of
    from support.standalone import wait_for

    root = ROOT
    code = ("import os, sys; from pathlib import Path; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/tests']\n"
            "from devtools.dags import DagFolder\n"
            "dag = DagFolder(Path(os.environ['AIRFLOW__CORE__DAGS_FOLDER']), '_older_').load('rt_overlap_allow')\n"
            "dag.test(logical_date=None, run_conf={'items': 4000, 'chunk': 1, 'sleep': 0.05})\n")
    older = subprocess.Popen([sys.executable, "-c", code, str(root)], env=os.environ.copy(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def older_live():
            with checkpoints.open() as s:
                s.ensure_schema()
                rows = [r for r in s.listings.live_others(JOB, NEW.isoformat()) if r.processed]
            return rows[0] if rows else None

        first = wait_for(older_live, timeout=300, what="the manual run's first checkpoint")
        run = run_dag("rt_overlap_skip", conf={"items": 5}, logical_date=NEW)
    finally:
        older.kill()
        older.wait(timeout=30)
    assert first.slot.startswith("manual__") and first.slot > NEW.isoformat(), "its slot sorts after the date"
    ti = run.get_task_instance("work")
    assert str(ti.state) == "skipped"
    started = first.started_at.isoformat(timespec="seconds")
    said = (f"run {first.run_id} (slot {first.slot}) of this job began first, at {started}, and is still running; "
            "overlap policy is 'skip'")
    out = "".join(capfd.readouterr())
    assert f"skipped by the overlap policy: {said}" in out
    overlap = overlap_of("rt_overlap_skip", run.run_id, "work")
    assert overlap == {"policy": "skip", "message": said,
                       "yielded_to": {"run_id": first.run_id, "slot": first.slot, "started_at": started}}
    json.dumps(overlap)
