"""Per-job summaries and re-running the failed partitions of a mapped job only: the summary's
arithmetic on rows of both stores, and real mapped and partitioned DAG runs (dag.test();
tests/dags/jobs_dags.py, tests/dags/partition_dags.py), through control and the CLI."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_resumable import control
from airflow_resumable.core.control import requests as core_control
from airflow_resumable.core.model.errors import CorruptCheckpoint, RequestRefused, SlotNotFound
from airflow_resumable.core.stores import Store
from airflow_resumable.core.work.partitions import Plan, replace_plan, save_plan
from support.module_cli import resumable_cli
from support.slots import SLOT, run_slot

JOB = "rt_jobs_mapped.part"


def ti_states(run_id: str) -> dict[int, tuple[str | None, int]]:
    """Each map index's (state, try number) in Airflow's metadata database."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter(TaskInstance.dag_id == "rt_jobs_mapped",
                                                 TaskInstance.run_id == run_id, TaskInstance.task_id == "part").all()
        return {ti.map_index: (None if ti.state is None else str(ti.state), ti.try_number) for ti in tis}


def test_the_summary_counts_a_mapped_job_s_partitions_and_rerun_failed_clears_only_the_failed_ones(
    checkpoints: Store, run_dag: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_dag("rt_jobs_mapped", conf={"fail_parts": [1]})
    before = ti_states(run.run_id)
    assert {i: s for i, (s, _) in before.items()} == {0: "success", 1: "failed", 2: "success"}

    line = next(j for j in control.jobs() if j["job"] == JOB)
    assert (line["dag_id"], line["task_id"], line["run_id"], line["mapped"]) == ("rt_jobs_mapped", "part", run.run_id,
                                                                                True)
    assert line["partitions"] == {"done": 2, "running": 0, "stalled": 0, "abandoned": 0, "paused": 0, "failed": 1, "waiting": 0, "other": 0,
                                  "total": 3}
    assert (line["processed"], line["total"], line["partitioned"]) == (4 + 2 + 4, 12, False)
    code, out, _ = resumable_cli("jobs", "--output", "json", capsys=capsys)
    assert code == 0 and next(j for j in json.loads(out) if j["job"] == JOB)["partitions"]["failed"] == 1
    code, out, _ = resumable_cli("jobs", "--dag-id", "rt_jobs_mapped", capsys=capsys)
    assert code == 0 and len([ln for ln in out.splitlines() if JOB in ln]) == 1, out  # one line per job

    code, out, err = resumable_cli("rerun-failed", JOB, run.run_id, "--by", "alice", "--output", "json", capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["cleared"] == [1]
    asked = [h for h in control.history(f"{JOB}[1]", line["slot"]) if h.outcome == "rerun_requested"]
    assert [h.requested_by for h in asked] == ["alice"], "who asked for the re-run is in the partition's history"
    after = ti_states(run.run_id)
    assert after[0] == before[0] and after[2] == before[2], "the partitions that succeeded keep their state"
    assert after[1][0] is None, "the failed partition is cleared: Airflow runs it again"

    with pytest.raises(RequestRefused, match="no task instance of DAG 'rt_jobs_mapped' task 'part' failed"):
        control.rerun_failed(JOB, run.run_id)
    code, _, err = resumable_cli("rerun-failed", JOB, "no_such_run", capsys=capsys)
    assert code == 1 and "no partition of this job ran in this DAG run" in err
    with pytest.raises(SlotNotFound):
        control.rerun_failed("no_such.job", run.run_id)


def test_a_partition_whose_task_instance_failed_while_its_row_says_running_is_abandoned_and_re_run_names_it(
    checkpoints: Store, run_dag: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Airflow failed two partitions; one's row still says running, its holder's lease not lapsed
    (its end was never written: the worker was lost). The jobs page counted it running, and the
    re-run's confirmation counted one failed partition while the re-run cleared two."""
    # Given such a run
    run = run_dag("rt_jobs_mapped", conf={"fail_parts": [1, 2]})
    assert {i: s for i, (s, _) in ti_states(run.run_id).items()} == {0: "success", 1: "failed", 2: "failed"}
    slot = next(j for j in control.jobs() if j["job"] == JOB)["slot"]
    with checkpoints.open(autocommit=True) as s, s.transaction():
        s.execute(f"UPDATE resumable_checkpoints SET status = 'running', lease_owner = 'w2', "
                  f"lease_expires_at = {s.d.now_plus('3600')}, heartbeat_at = {s.d.now()} "
                  "WHERE job = %(job)s AND slot = %(slot)s", {"job": f"{JOB}[2]", "slot": slot})

    # When the jobs are listed with Airflow's states (as the REST API and the jobs page list them)
    line = next(j for j in control.jobs(task_states=control.task_instance_states) if j["job"] == JOB)
    detail = control.job_partitions(JOB, run.run_id, task_states=control.task_instance_states)
    tab = control.find_detail("rt_jobs_mapped", "part", run.run_id, 2,
                              ti_state=control.task_instance_states("rt_jobs_mapped", "part", run.run_id)[2])

    # Then nothing says it runs: the line counts it abandoned and says how Airflow has them
    for shown in (line, detail):
        assert {k: v for k, v in shown["partitions"].items() if v} == {"done": 1, "failed": 1, "abandoned": 1,
                                                                        "total": 3}, shown
        assert shown["task_instances"] == {"failed": 2, "success": 1} and shown["rate"] is None
    row = next(r for r in detail["partition_rows"] if r["map_index"] == 2)
    assert (row["status"], row["shown_status"], row["task_state"]) == ("running", "abandoned", "failed")
    assert tab is not None and (tab["shown_status"], tab["last_holder"]) == ("abandoned", "w2")
    assert "task instance is failed" in tab["shown_why"] and tab["offers"]["pause"] is False
    assert tab["offer_notes"]["pause"].startswith("Not now: nobody runs this slot")
    # And the CLI says the same: its job line, the job's partitions and the slot's detail
    code, out, err = resumable_cli("jobs", "--output", "json", capsys=capsys)
    assert code == 0, err
    cli_line = next(j for j in json.loads(out) if j["job"] == JOB)
    assert (cli_line["partitions"]["running"], cli_line["partitions"]["abandoned"]) == (0, 1), cli_line
    code, out, err = resumable_cli("jobs", "--job", JOB, "--run-id", run.run_id, capsys=capsys)
    assert code == 0 and "abandoned (its row says running)" in out, out + err
    code, out, err = resumable_cli("show", f"{JOB}[2]", slot, "--output", "json", capsys=capsys)
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["shown_status"], shown["last_holder"]) == ("abandoned", "w2") and not shown["offers"]["pause"]
    # And the list of slots (it printed the row's running)
    code, out, err = resumable_cli("list", "--dag-id", "rt_jobs_mapped", "--output", "json", capsys=capsys)
    assert code == 0, err
    assert [r["shown_status"] for r in json.loads(out) if r["job"] == f"{JOB}[2]"] == ["abandoned"], out
    code, out, err = resumable_cli("list", "--dag-id", "rt_jobs_mapped", capsys=capsys)
    assert code == 0 and "abandoned (its row says" in out and " running " not in out, out + err
    # And the re-run's confirmation names what the re-run then clears: both failed partitions
    assert control.rerun_candidates(JOB, run.run_id)["failed"] == [1, 2]
    assert control.rerun_failed(JOB, run.run_id, by="alice") == [1, 2]


# -- a partitioned job as one job -------------------------------------------------------------------


def _set(store: Store, job: str, *, lease: bool = False, **values: Any) -> None:
    """Put the slot's row in a state a real attempt would leave it in mid-run (``lease``: held
    by a live attempt for an hour)."""
    with store.open(autocommit=True) as s:
        sets = ", ".join([f"{k} = %({k})s" for k in values] +
                         ([f"lease_owner = 'w2', lease_expires_at = {s.d.now_plus('3600')}"] if lease else []))
        with s.transaction():
            s.execute(f"UPDATE resumable_checkpoints SET {sets} WHERE job = %(job)s AND slot = %(slot)s",
                      {**values, "job": job, "slot": SLOT})


def test_a_partitioned_job_is_one_line_summing_its_partitions_with_the_plan_folded_in(store: Store) -> None:
    # Given a job planned in 5 partitions of 100 rows: one done, one failed at 10, one paused, one
    # running at 20 items/s, and one not started yet
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, "d.exp", SLOT, Plan(5, (20, 40, 60, 80), 100))
    for i, fail_at in enumerate((None, 10, None, None)):
        run_slot(store, f"d.exp[{i}]", "d", task_id="exp.partition", map_index=i, fail_at=fail_at, n=20)
    _set(store, "d.exp[2]", status="paused", processed=5)
    _set(store, "d.exp[3]", status="running", processed=15, rate=20.0, lease=True)

    # When the jobs are listed
    lines = core_control.jobs(store)

    # Then the job is one line (its plan row is no job of its own), its partitions counted by how
    # they stand, its progress the sum of theirs, its ETA from the live partitions' rates
    assert [j["job"] for j in lines] == ["d.exp"]
    line = lines[0]
    assert line["partitions"] == {"done": 1, "running": 1, "stalled": 0, "abandoned": 0, "paused": 1, "failed": 1, "waiting": 1, "other": 0,
                                  "total": 5}
    assert (line["partitioned"], line["mapped"], line["task_id"], line["run_id"]) == (True, True, "exp.partition",
                                                                                     "run_1")
    assert (line["processed"], line["total"], line["percent"]) == (20 + 10 + 5 + 15, 100, 50.0)
    # (the ETA counts down from the running partition's last checkpoint, as that partition's own does)
    assert line["rate"] == 20.0 and 2.0 < line["eta_seconds"] <= 2.5

    # And the job's partitions, by map index, are a way into each: the planned one not started too
    line, rows = core_control.job_partitions(store, "d.exp", "run_1")
    assert [(i, r.status if r else None) for i, r in rows] == [(0, "done"), (1, "failed"), (2, "paused"),
                                                               (3, "running"), (4, None)]
    with pytest.raises(SlotNotFound, match="no partition of this job ran"):
        core_control.job_partitions(store, "d.exp", "no_such_run")


def test_once_every_partition_started_the_total_is_the_sum_of_the_ranges_they_counted(store: Store) -> None:
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, "d.exp", SLOT, Plan(2, (10,), 30))  # counted 30 when it split
    run_slot(store, "d.exp[0]", "d", task_id="exp.partition", map_index=0, n=10)
    run_slot(store, "d.exp[1]", "d", task_id="exp.partition", map_index=1, n=25)  # 5 rows arrived since
    line = core_control.jobs(store)[0]
    assert (line["processed"], line["total"], line["percent"], line["rate"], line["eta_seconds"]) == (35, 35, 100.0,
                                                                                                    None, None)
    assert line["partitions"]["done"] == 2 and line["partitions"]["waiting"] == 0


def test_partitions_of_an_earlier_split_into_more_are_not_counted_once_the_plan_split_anew_into_fewer(
        store: Store) -> None:
    # Given a job split into 4 partitions that all ran, its plan then split anew into 2 on purpose
    # (a restart of '<job>#plan'): partitions [2] and [3] keep their rows, of no partition now
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, "d.exp", SLOT, Plan(4, (10, 20, 30), 40))
    for i, n in enumerate((10, 10, 10, 10)):
        run_slot(store, f"d.exp[{i}]", "d", task_id="exp.partition", map_index=i, fail_at=5 if i == 3 else None, n=n)
    _set(store, "d.exp#plan", request="restart")
    with store.open(autocommit=True) as s:
        assert replace_plan(s, "d.exp", SLOT, Plan(2, (25,), 50))
    core_control.restart(store, "d.exp[0]", SLOT, by="planner")  # as the split asks each partition
    run_slot(store, "d.exp[0]", "d", task_id="exp.partition", map_index=0, n=25)  # started over: its new range
    # When the jobs are listed, and the job's partitions
    line = core_control.jobs(store)[0]
    detail, rows = core_control.job_partitions(store, "d.exp", "run_1")
    # Then the line counts the plan's 2 partitions only: [0] done at 25, [1] as it stands, nothing of [2], [3]
    assert line["partitions"] == {"done": 2, "running": 0, "stalled": 0, "abandoned": 0, "paused": 0, "failed": 0, "waiting": 0, "other": 0,
                                  "total": 2}, line
    assert (line["processed"], line["total"]) == (25 + 10, 25 + 10)
    assert detail == line and [(i, r.job) for i, r in rows] == [(0, "d.exp[0]"), (1, "d.exp[1]")]
    # And the rows of the earlier split are still there, untouched
    with store.open() as s:
        assert s.checkpoints.load("d.exp[3]", SLOT).status == "failed"


@pytest.mark.parametrize("edit", ["another_dag", "another_run", "corrupt_state", "live", "huge_map_index",
                                  "map_index_not_its_name"])
def test_partitions_past_the_plan_are_taken_out_of_the_line_only_as_they_were_counted_in_it(
        store: Store, edit: str) -> None:
    # Given the job split into 4 then anew into 2, [1] running at 5 items/s, and the old [2] edited
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, "d.exp", SLOT, Plan(4, (10, 20, 30), 40))
    for i in range(4):
        run_slot(store, f"d.exp[{i}]", "d", task_id="exp.partition", map_index=i, n=10)
    _set(store, "d.exp#plan", request="restart")
    with store.open(autocommit=True) as s:
        assert replace_plan(s, "d.exp", SLOT, Plan(2, (25,), 50))
    _set(store, "d.exp[1]", status="running", processed=5, rate=5.0, lease=True)
    _set(store, "d.exp[2]", **{
        "another_dag": {"dag_id": "other_dag"}, "another_run": {"run_id": "run_0"},
        "corrupt_state": {"state": "["}, "live": {"status": "running", "rate": 100.0},
        "huge_map_index": {"map_index": 2**31 - 1}, "map_index_not_its_name": {"map_index": 1},
    }[edit], lease=edit == "live")
    # When the jobs are listed (as a user who may read DAG d) and the run's partitions
    line = core_control.jobs(store, dag_ids={"d"})[0]
    detail, rows = core_control.job_partitions(store, "d.exp", "run_1")
    # Then both show the plan's 2 partitions: [0] done, [1] running at its own rate; nothing of [2], [3]
    for shown in (line, detail):
        assert shown["partitions"] == {"done": 1, "running": 1, "stalled": 0, "abandoned": 0, "paused": 0, "failed": 0, "waiting": 0, "other": 0,
                                       "total": 2}, (edit, shown)
        assert (shown["processed"], shown["rate"]) == (10 + 5, 5.0), (edit, shown)
    assert [i for i, _ in rows] == [0, 1]


@pytest.mark.one_store("only SQLite keeps text or infinity in a number column (PostgreSQL refuses the edit)")
def test_a_row_edited_by_hand_leaves_its_group_s_numbers_out_of_the_jobs_line_not_the_jobs_list(store: Store) -> None:
    # Given a job's two partitions, one of them edited by hand: an infinite count and a time as text
    for i in range(2):
        run_slot(store, f"d.exp[{i}]", "d", task_id="exp.partition", map_index=i, n=10)
    run_slot(store, "e.other", "e", n=10)
    _set(store, "d.exp[1]", processed=float("inf"), updated_at="yesterday")
    # When the jobs are listed: every job; the edited partition's count is left out of the sum (the
    # decoder's rule, in SQL), before: OverflowError, the whole list a 500
    lines = {line["job"]: line for line in core_control.jobs(store)}
    assert set(lines) == {"d.exp", "e.other"} and lines["e.other"]["processed"] == 10
    assert lines["d.exp"]["partitions"]["done"] == 2 and lines["d.exp"]["processed"] == 10
    # And a map index edited into text still lists every job (the edited one as its rows name it)
    _set(store, "d.exp[1]", map_index="")
    assert "e.other" in {line["job"] for line in core_control.jobs(store)}


def test_a_count_edited_by_hand_out_of_its_range_counts_for_nothing_in_the_jobs_line(store: Store) -> None:
    # Given a job planned in 3 partitions of 10 rows, all done, two of them edited by hand: a negative
    # total, a negative processed and a rate below zero (the decoder refuses each such row)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, "d.exp", SLOT, Plan(3, (10, 20), 30))
    for i in range(3):
        run_slot(store, f"d.exp[{i}]", "d", task_id="exp.partition", map_index=i, n=10)
    _set(store, "d.exp[1]", total=-10)
    _set(store, "d.exp[2]", processed=-5, rate=-1.0)
    # When the jobs are listed
    line = core_control.jobs(store)[0]
    # Then the line adds up only what the decoder would read, the plan's total standing for the range
    # it cannot count: never a total or a count below zero (before: total 10, processed 15, 150 %)
    assert (line["processed"], line["total"], line["percent"]) == (20, 30, pytest.approx(66.7, abs=0.1))
    assert line["partitions"]["done"] == 3
    # And the partition's own detail refuses the row, naming it
    with pytest.raises(CorruptCheckpoint, match="total"):
        core_control.job_partitions(store, "d.exp", "run_1")


def test_a_plan_row_edited_into_text_that_is_not_json_leaves_every_job_listed(store: Store) -> None:
    # Given a partitioned job beside another job, and the plan row's state edited by hand into text
    # that is not JSON
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, "d.exp", SLOT, Plan(2, (10,), 20))
    for i in range(2):
        run_slot(store, f"d.exp[{i}]", "d", task_id="exp.partition", map_index=i, n=10)
    run_slot(store, "e.other", "e", task_id="other", n=10)
    assert {line["job"]: line["partitioned"] for line in core_control.jobs(store)} == {"d.exp": True, "e.other": False}
    _set(store, "d.exp#plan", state="{not json")
    # When the jobs are listed
    lines = {line["job"]: line for line in core_control.jobs(store)}
    # Then both are (before: every listing failed on the one row's CorruptCheckpoint), the edited one
    # as its partitions' rows stand, without its plan
    assert set(lines) == {"d.exp", "e.other"}
    assert lines["d.exp"]["partitions"]["done"] == 2 and lines["d.exp"]["planned"] is None
    assert lines["d.exp"]["plan_request"] is None


def test_a_partitioned_run_s_summary_and_rerun_failed_clear_the_failed_partition_and_the_summary(
    checkpoints: Store, source: Any, run_dag: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a partitioned run (4 partitions, one tolerated) whose partitions 1 and 2 failed
    source.run("CREATE TABLE pt_source (grp TEXT NOT NULL, id INTEGER NOT NULL, PRIMARY KEY (grp, id))")
    source.run("INSERT INTO pt_source (grp, id) VALUES (%s, %s)", [("a", i) for i in range(40)])
    run = run_dag("pt_tolerant", conf={"fail": {"1": [1], "2": [1]}}, logical_date=datetime(2026, 3, 1, tzinfo=timezone.utc))
    assert str(run.state) == "failed"
    job = "pt_tolerant.export"

    # Then the jobs listing and the CLI show it as one job: 2 partitions done, 2 failed
    line = next(j for j in control.jobs() if j["job"].startswith("pt_tolerant"))
    assert line["job"] == job and line["partitioned"] and line["partitions"]["failed"] == 2
    assert (line["processed"], line["total"]) == (20 + 3 + 3, 40)
    code, out, err = resumable_cli("jobs", "--job", job, "--output", "json", capsys=capsys)
    assert code == 0, err
    detail = json.loads(out)
    assert [(r["map_index"], r["status"]) for r in detail["partition_rows"]] == [
        (0, "done"), (1, "failed"), (2, "failed"), (3, "done")]
    code, out, err = resumable_cli("jobs", "--job", job, capsys=capsys)
    assert code == 0 and "pt_tolerant.export[2]" in out and "failed" in out, err

    # When the failed partitions are re-run as one action
    cleared = control.rerun_failed(job, run.run_id, by="bob")

    # Then partitions 1 and 2 and the summary are cleared (Airflow runs them again), the others keep theirs
    assert cleared == [1, 2]
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = {(ti.task_id, ti.map_index): ti.state for ti in session.query(TaskInstance).filter(
            TaskInstance.dag_id == "pt_tolerant", TaskInstance.run_id == run.run_id)}
    assert tis[("export.partition", 1)] is None and tis[("export.partition", 2)] is None
    assert tis[("export.summary", -1)] is None
    assert {str(tis[("export.partition", i)]) for i in (0, 3)} == {"success"}
    assert [h.requested_by for h in control.history(f"{job}[2]", line["slot"]) if h.outcome == "rerun_requested"] == [
        "bob"]
    assert tis[("export.plan", -1)] is not None


def test_the_partitions_detail_checks_the_caller_before_it_reads_any_partition_s_row(store: Store) -> None:
    # Given a job of DAG d whose partition [1] was edited by hand into a row that cannot be read
    for i in range(2):
        run_slot(store, f"d.exp[{i}]", "d", task_id="exp.partition", map_index=i, n=10)
    _set(store, "d.exp[1]", state="[")
    asked: list[str | None] = []

    class Refused(Exception):
        pass

    def refuse(dag_id: str | None) -> None:
        asked.append(dag_id)
        raise Refused

    # When a caller the check refuses asks for the detail: the check's refusal, nothing of the rows (the REST
    # API's 403; before, its 500 named the corrupt value and the DELETE to a user who may not read DAG d)
    with pytest.raises(Refused):
        core_control.job_partitions(store, "d.exp", "run_1", check=refuse)
    assert asked == ["d"]
    # And one it lets through gets the corrupt row's error, naming it
    with pytest.raises(CorruptCheckpoint, match=r"d\.exp\[1\]"):
        core_control.job_partitions(store, "d.exp", "run_1", check=asked.append)


@pytest.mark.one_store("only SQLite keeps a fraction in an INTEGER column (PostgreSQL refuses the edit)", kind="sqlite")
def test_a_fraction_edited_into_a_count_counts_for_nothing_in_the_jobs_line(store: Store) -> None:
    # Given a job's two partitions of 10, one edited by hand into counts with fractions (the decoder
    # refuses a number column that does not hold a whole number)
    for i in range(2):
        run_slot(store, f"d.exp[{i}]", "d", task_id="exp.partition", map_index=i, n=10)
    _set(store, "d.exp[1]", processed=5.5, total=7.25)
    # When the jobs are listed, then the line adds up only what the decoder would read (before: 15 of 17,
    # the fractions summed in and cut off): the edited total counts for nothing, so the job's is unknown
    line = core_control.jobs(store)[0]
    assert (line["processed"], line["total"]) == (10, None)
    assert line["partitions"]["done"] == 2
    with pytest.raises(CorruptCheckpoint, match="processed"):
        core_control.job_partitions(store, "d.exp", "run_1")


# -- rebalancing: ranges taken from running partitions --------------------------------------------


@pytest.mark.parametrize(("own", "taken", "counts", "processed", "total"), [
    # [1] runs on what it kept, [2]'s task instance runs what it took: line 1 is running
    ("running", "running", {"done": 2, "running": 1}, 10 + 3 + 10 + 2, 30),
    # [1] finished what it kept, the taken range still runs: line 1 is running, not done
    ("done", "running", {"done": 2, "running": 1}, 10 + 5 + 10 + 2, 30),
    # both finished: line 1 is done once, the job's total the ranges' added up
    ("done", "done", {"done": 3}, 10 + 5 + 10 + 5, 30),
    # the taker died before it started the range: line 1 is unfinished, its total not known yet
    ("done", None, {"done": 2, "failed": 1}, 10 + 5 + 10, 30),
])
def test_a_partitioned_job_s_line_counts_a_partition_with_a_range_taken_from_it_once_and_lists_the_split(
        store: Store, own: str, taken: str | None, counts: dict[str, int], processed: int, total: int,
        capsys: pytest.CaptureFixture[str]) -> None:
    from support.slots import SPLIT_WHEN, split_job

    # Given a job of 3 partitions whose [2] took the upper half of [1]'s range (<job>[1].1, run by [2])
    split_job(store, "d.exp", "d", own=own, taken=taken)

    # When the jobs are listed, and the job's partitions
    line = core_control.jobs(store)[0]
    detail, rows = core_control.job_partitions(store, "d.exp", "run_1")

    # Then the job is one line of the plan's 3 partitions (the taken range is part of [1]'s line,
    # no partition of its own, no job of its own), its figures the ranges' added up
    for shown in (line, detail):
        assert [j["job"] for j in core_control.jobs(store)] == ["d.exp"]
        assert {k: v for k, v in shown["partitions"].items() if v} == {**counts, "total": 3}, shown
        assert (shown["processed"], shown["total"]) == (processed, total), shown
        # And the split says which range took what from whom, when, and who runs it now, how far
        assert shown["splits"] == [{
            "number": 1, "range": "1.1", "job": "d.exp[1].1", "partition": 1, "of": "1", "from": "d.exp[1]",
            "after": 15, "until": 20, "by": "d.exp[2]", "when": SPLIT_WHEN,
            "status": taken or "waiting", "shown_status": taken or "waiting",
            "map_index": None if taken is None else 2,
            "processed": None if taken is None else 2 if taken == "running" else 5,
            "total": None if taken is None else 5}], shown["splits"]
    assert [(i, r.job if r else None) for i, r in rows] == [(0, "d.exp[0]"), (1, "d.exp[1]"), (2, "d.exp[2]")]


def test_the_cli_shows_a_partitioned_job_s_splits_under_its_line(
        checkpoints: Store, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``airflow resumable jobs`` counted the taken range as a fourth partition, and nothing
    said which partition took what from whom."""
    from support.slots import SPLIT_WHEN, split_job

    # Given a job of 3 partitions whose [2] took the upper half of [1]'s range, still running it
    split_job(checkpoints, "d.exp", "d", own="done", taken="running")
    # When the jobs are listed, as JSON and as a table, and the job's partitions
    code, out, err = resumable_cli("jobs", "--output", "json", capsys=capsys)
    assert code == 0, err
    line = next(j for j in json.loads(out) if j["job"] == "d.exp")
    code, table, err = resumable_cli("jobs", capsys=capsys)
    assert code == 0, err
    code, detail, err = resumable_cli("jobs", "--job", "d.exp", "--run-id", "run_1", capsys=capsys)
    assert code == 0, err
    # Then the line counts the plan's 3 partitions and names the split; the job's view lists it
    assert (line["partitions"]["total"], line["partitions"]["running"], line["processed"]) == (3, 1, 27), line
    assert [(s["range"], s["from"], s["by"], s["when"], s["map_index"]) for s in line["splits"]] == [
        ("1.1", "d.exp[1]", "d.exp[2]", SPLIT_WHEN, 2)]
    assert "1.1 of 1" in table and "(running)" in table and "d.exp[1].1" not in table, table
    assert "d.exp[1].1" in detail and SPLIT_WHEN in detail and "2/5" in detail, detail
    # And each slot's own detail says where rebalancing put it: the taken range, and what [1] kept
    code, out, err = resumable_cli("show", "d.exp[1].1", SLOT, "--output", "json", capsys=capsys)
    assert code == 0, err
    assert {k: json.loads(out)["range"][k] for k in ("range", "from", "after", "until", "by", "when")} == {
        "range": "1.1", "from": "d.exp[1]", "after": 15, "until": 20, "by": "d.exp[2]", "when": SPLIT_WHEN}
    code, out, err = resumable_cli("show", "d.exp[1]", SLOT, "--output", "json", capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["range"] == {"range": "1", "after": 10, "until": 15, "taken": ["d.exp[1].1"]}
    code, out, err = resumable_cli("show", "d.exp[0]", SLOT, "--output", "json", capsys=capsys)
    assert code == 0 and "range" not in json.loads(out), out
