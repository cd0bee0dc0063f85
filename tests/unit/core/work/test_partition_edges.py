"""A partitioned job at its edges: requests on its plan refused or carried out whole, data and
hand edits between attempts, and odd arguments. On both stores; the DAG runs through ``dag.test()``
(tests/dags/partition_dags.py)."""

from __future__ import annotations

import re
import threading
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_resumable import control
from airflow_resumable.core import Attempt
from airflow_resumable.core.control import requests as core_control
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import Store
from airflow_resumable.core.work.partitions import load_plan
from support.partition_source import table
from support.sources import Source
from support.xcoms import xcom

DAY = datetime(2026, 3, 1, tzinfo=timezone.utc)
SLOT = DAY.isoformat()
ROWS = [("a" if i < 30 else "b", i) for i in range(40)]
JOB = "pt_tolerant.export"


def rows_of(store: Store, job: str, n: int = 4) -> list[Any]:
    with store.open() as s:
        return [s.checkpoints.load(f"{job}[{i}]", SLOT) for i in range(n)]


def test_a_restart_of_the_plan_while_a_partition_runs_is_refused_whole_and_carried_out_once_it_ends(
    checkpoints: Store, source: Source, run_dag: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a run whose partition 1 failed in its second chunk (one failure tolerated), the others done
    table(source, ROWS)
    assert str(run_dag("pt_tolerant", conf={"fail": {"1": [1]}}, logical_date=DAY).state) == "success"
    before = rows_of(checkpoints, JOB)
    assert [r.status for r in before] == ["done", "failed", "done", "done"]
    with checkpoints.open() as s:
        plan = load_plan(s, JOB, SLOT)
    # and an attempt of partition 1 that holds its slot (a worker still running it)
    holding, release = threading.Event(), threading.Event()

    def hold(ctx: Any) -> None:
        holding.set()
        release.wait(60)

    holder = threading.Thread(target=lambda: Attempt(
        checkpoints, Identity(job=f"{JOB}[1]", slot=SLOT, attempt=7, owner="worker-7"),
    ).run(hold), daemon=True)
    holder.start()
    assert holding.wait(30)
    try:
        # When someone restarts the job's plan and the run runs again
        control.restart(f"{JOB}#plan", SLOT, by="dora")
        again = run_dag("pt_tolerant", logical_date=DAY)

        # Then the planning task fails without a retry, naming the running partition and what to do
        ti = again.get_task_instance("export.plan")
        assert str(ti.state) == "failed"
        said = capsys.readouterr().out
        assert f"{JOB}[1]: an attempt is running the slot (worker-7" in said, said[-3000:]
        assert "The plan was kept, and the request is still pending on its row. No partition was asked" in said
        with checkpoints.open() as s:
            plan_row = s.checkpoints.load(f"{JOB}#plan", SLOT)
            kept = load_plan(s, JOB, SLOT)
        # And nothing was changed: the plan is kept, its request still pending, and no partition was asked to restart
        assert kept == plan
        assert (plan_row.request, plan_row.requested_by) == ("restart", "dora")
        assert [r.request for r in rows_of(checkpoints, JOB)] == [None] * 4
        # And the job's line (jobs page, REST, CLI) says the restart of the whole job waits, and who asked
        [line] = [j for j in core_control.jobs(checkpoints) if j["job"] == JOB]
        assert line["plan_request"] == {"request": "restart", "requested_by": "dora"}
    finally:
        release.set()
        holder.join(60)

    # When the partition has ended and the run runs again
    third = run_dag("pt_tolerant", logical_date=DAY)

    # Then the restart is carried out: the plan is split anew, every partition starts over and ends done
    assert str(third.state) == "success"
    with checkpoints.open() as s:
        plan_row = s.checkpoints.load(f"{JOB}#plan", SLOT)
    assert plan_row.request is None and plan_row.runs == 2
    [line] = [j for j in core_control.jobs(checkpoints) if j["job"] == JOB]
    assert line["plan_request"] is None
    assert [(r.status, r.processed) for r in rows_of(checkpoints, JOB)] == [("done", 10)] * 4
    summary = xcom(third, "export.summary", required=True)
    assert (summary["planned"], summary["processed"], summary["shortfall"]) == (40, 40, 0)


def test_a_plan_row_broken_by_hand_is_refused_naming_the_restart_that_splits_the_job_anew(
    checkpoints: Store, source: Source, run_dag: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    # Given a run whose partition 1 failed, and its plan row's state then overwritten by hand
    table(source, ROWS)
    assert str(run_dag("pt_tolerant", conf={"fail": {"1": [1]}}, logical_date=DAY).state) == "success"
    with checkpoints.open() as s:
        s.execute("UPDATE resumable_checkpoints SET state = %s WHERE job = %s", (json.dumps({"x": 1}), f"{JOB}#plan"))
        s.commit()
    capsys.readouterr()

    # When the run runs again: the planning task refuses the row, naming the restart as the way out
    again = run_dag("pt_tolerant", logical_date=DAY)
    assert str(again.get_task_instance("export.plan").state) == "failed"
    said = capsys.readouterr().out
    assert "the plan row's state is not a plan" in said
    assert f"airflow resumable restart '{JOB}#plan' '{SLOT}'" in said, said[-2000:]
    assert "Deleting the row instead would split anew while the partitions keep the progress" in said

    # And that restart splits the job anew: every partition starts over, every row is processed once
    control.restart(f"{JOB}#plan", SLOT, by="erin")
    third = run_dag("pt_tolerant", logical_date=DAY)
    assert str(third.state) == "success"
    assert [(r.status, r.processed) for r in rows_of(checkpoints, JOB)] == [("done", 10)] * 4
    summary = xcom(third, "export.summary", required=True)
    assert (summary["planned"], summary["processed"], summary["shortfall"]) == (40, 40, 0)


def test_a_plan_row_deleted_by_hand_is_not_split_anew_under_partitions_that_kept_their_progress(
    checkpoints: Store, source: Source, run_dag: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a run whose partition 1 failed, its plan row then deleted by hand, and rows added since
    table(source, ROWS)
    assert str(run_dag("pt_tolerant", conf={"fail": {"1": [1]}}, logical_date=DAY).state) == "success"
    with checkpoints.open() as s:
        s.execute("DELETE FROM resumable_checkpoints WHERE job = %s", (f"{JOB}#plan",))
        s.commit()
    source.run("INSERT INTO pt_source (grp, id) VALUES (%s, %s)", [("a", 100 + i) for i in range(8)])
    capsys.readouterr()

    # When the run runs again: the planning task refuses to split, naming the partitions and the choices
    again = run_dag("pt_tolerant", logical_date=DAY)
    assert str(again.get_task_instance("export.plan").state) == "failed"
    said = capsys.readouterr().out
    assert (f"the slot has no plan, but partition(s) {JOB}[0], {JOB}[1], {JOB}[2], {JOB}[3] have checkpoints in it"
            in said), said[-2000:]
    assert "Put the plan's row back, or start the job over in this run on purpose" in said
    with checkpoints.open() as s:
        assert s.checkpoints.load(f"{JOB}#plan", SLOT) is None
    assert rows_of(checkpoints, JOB)[1].processed == 3  # partition 1 kept its checkpoint, nothing was read

    # And once the partitions' rows are deleted too, with the statement the error names (a look-alike
    # job's partition, which a LIKE 'pt_tolerant...' would have matched, kept), the job starts over in
    # this run: every row once
    lookalike = Attempt(checkpoints, Identity(job="ptXtolerant.export[0]", slot=SLOT, attempt=1, owner="o"))
    lookalike.run(lambda ctx: None)
    statement = re.search(r"DELETE FROM resumable_checkpoints WHERE .*? AND slot = '[^']*'", said)
    assert statement, said[-2000:]
    with checkpoints.open() as s:
        s.execute(statement.group(0))
        s.commit()
        assert s.checkpoints.load("ptXtolerant.export[0]", SLOT) is not None
    assert rows_of(checkpoints, JOB) == [None] * 4
    third = run_dag("pt_tolerant", logical_date=DAY)
    assert str(third.state) == "success"
    summary = xcom(third, "export.summary", required=True)
    assert (summary["planned"], summary["processed"], summary["shortfall"]) == (48, 48, 0)
