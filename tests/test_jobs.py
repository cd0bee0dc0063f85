"""Per-job summaries and re-running the failed partitions of a mapped job only, on a real mapped
DAG run (dag.test(); tests/dags/jobs_dags.py), through control, the CLI and the REST API's code."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_resumable import control
from airflow_resumable.core.errors import RequestRefused, SlotNotFound
from airflow_resumable.core.stores import Store

JOB = "rt_jobs_mapped.part"


def ti_states(run_id: str) -> dict[int, tuple[str | None, int]]:
    """Each map index's (state, try number) in Airflow's metadata database."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter(TaskInstance.dag_id == "rt_jobs_mapped",
                                                 TaskInstance.run_id == run_id, TaskInstance.task_id == "part").all()
        return {ti.map_index: (None if ti.state is None else str(ti.state), ti.try_number) for ti in tis}


def cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``airflow resumable <argv>``, or ``python -m airflow_resumable <argv>`` on an Airflow that reads
    no provider commands (the same definitions)."""
    from airflow_resumable.version_compat import supports

    capsys.readouterr()  # what ran before
    try:
        if supports("airflow resumable ... (provider CLI commands)"):
            from airflow.cli import cli_parser

            args = cli_parser.get_parser().parse_args(["resumable", *argv])
            args.func(args)
            code = 0
        else:
            from support.module_cli import run_module_cli

            code = run_module_cli(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_summary_counts_a_mapped_job_s_partitions_and_rerun_failed_clears_only_the_failed_ones(
    checkpoints: Store, run_dag: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_dag("rt_jobs_mapped", conf={"fail_parts": [1]})
    before = ti_states(run.run_id)
    assert {i: s for i, (s, _) in before.items()} == {0: "success", 1: "failed", 2: "success"}

    line = next(j for j in control.jobs() if j["job"] == JOB)
    assert (line["dag_id"], line["task_id"], line["run_id"], line["mapped"]) == ("rt_jobs_mapped", "part", run.run_id,
                                                                                True)
    assert line["partitions"] == {"done": 2, "failed": 1, "running": 0, "other": 0, "total": 3}
    code, out, _ = cli("jobs", "--output", "json", capsys=capsys)
    assert code == 0 and next(j for j in json.loads(out) if j["job"] == JOB)["partitions"]["failed"] == 1
    code, out, _ = cli("jobs", "--dag-id", "rt_jobs_mapped", capsys=capsys)
    assert code == 0 and len([ln for ln in out.splitlines() if JOB in ln]) == 1, out  # one line per job

    code, out, err = cli("rerun-failed", JOB, run.run_id, "--output", "json", capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["cleared"] == [1]
    after = ti_states(run.run_id)
    assert after[0] == before[0] and after[2] == before[2], "the partitions that succeeded keep their state"
    assert after[1][0] is None, "the failed partition is cleared: Airflow runs it again"

    with pytest.raises(RequestRefused, match="no task instance of DAG 'rt_jobs_mapped' task 'part' failed"):
        control.rerun_failed(JOB, run.run_id)
    code, _, err = cli("rerun-failed", JOB, "no_such_run", capsys=capsys)
    assert code == 1 and "no partition of this job ran in this DAG run" in err
    with pytest.raises(SlotNotFound):
        control.rerun_failed("no_such.job", run.run_id)
