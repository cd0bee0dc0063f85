"""A partitioned job's summary accounts for every planned row: processed, skipped (dead letters), in
unfinished partitions, gone from the source since the plan; a shortfall nothing explains fails the
summary task, or, tolerated on purpose, is named in its first line and warned of.

The arithmetic on plain values; the rest through ``dag.test()`` (tests/dags/partition_dags.py) on
both stores, the jobs listing and the CLI reading the same rows.
"""

from __future__ import annotations

import json
import warnings
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_resumable import control
from airflow_resumable.core.model.checkpoint import Checkpoint
from airflow_resumable.core.stores import Store
from airflow_resumable.core.work.partition_summary import summarize
from airflow_resumable.core.work.partitions import Plan
from support.module_cli import resumable_cli
from support.partition_source import table
from support.sources import Source
from support.xcoms import xcom

DAY = datetime(2026, 3, 1, tzinfo=timezone.utc)
SLOT = DAY.isoformat()
ROWS = [("a" if i < 30 else "b", i) for i in range(40)]


def _row(status: str, processed: int) -> Checkpoint:
    return Checkpoint(job="j", slot=SLOT, status=status, processed=processed, total=processed)


def test_every_planned_row_is_processed_skipped_unfinished_gone_or_a_named_shortfall() -> None:
    # Given a plan of 40 rows in 4 ranges of 10, and partitions that read 10 (2 of them dead letters),
    # 8 (their range holds 8 now: 2 deleted), 7 (their range still holds 10) and 3 (failed)
    plan = Plan(4, (9, 19, 29), 40)
    rows = [_row("done", 10), _row("done", 8), _row("done", 7), _row("failed", 3)]
    now = {1: 8, 2: 10}

    strict = summarize("pt", SLOT, rows, tolerated=1, plan=plan, skipped=[2, 0, 0, 0], count=now.get)
    tolerant = summarize("pt", SLOT, rows, tolerated=1, plan=plan, skipped=[2, 0, 0, 0], count=now.get,
                         tolerated_shortfall="10%")

    # Then 40 = 26 processed + 2 skipped + 7 unfinished + 2 gone + 3 unexplained, the last failing the
    # job unless tolerated; a tolerated shortfall heads the summary
    figures = strict.as_json()
    assert {k: figures[k] for k in ("planned", "processed", "skipped", "unfinished", "gone", "shortfall", "short",
                                    "more")} == {"planned": 40, "processed": 26, "skipped": 2, "unfinished": 7,
                                                 "gone": 2, "shortfall": 3, "short": [2], "more": 0}
    assert list(figures)[0] == "summary"
    error = strict.error()
    assert not strict.ok and error is not None and "3 of 40 planned rows were neither processed" in str(error)
    assert "pt[2]" in str(error) and "tolerated_shortfall" in str(error)
    assert tolerant.ok and tolerant.error() is None
    assert tolerant.headline().startswith("SHORTFALL TOLERATED (3 of 40 planned rows")
    assert "26 processed, 2 skipped (dead letters), 7 not read by the unfinished partition(s) 3, 2 gone" in \
        tolerant.headline()


def test_rows_written_after_the_plan_are_more_not_a_shortfall() -> None:
    plan = Plan(2, (9,), 20)
    summary = summarize("pt", SLOT, [_row("done", 10), _row("done", 14)], tolerated=0, plan=plan)
    assert summary.ok and (summary.more, summary.shortfall) == (4, 0)
    assert "4 more than planned" in summary.headline()


def test_the_summary_of_a_run_with_skipped_rows_names_them_beside_the_processed_ones(
    checkpoints: Store, source: Source, run_dag: Any
) -> None:
    # Given 40 rows, two of which the processing refuses (the skip policy records them)
    table(source, ROWS)

    # When the partitioned job runs
    run = run_dag("pt_skips", conf={"bad": [13, 27]}, logical_date=DAY)

    # Then it succeeds, and its summary (first line first) says 38 processed and 2 skipped of 40 planned
    assert str(run.state) == "success"
    summary = xcom(run, "export.summary", required=True)
    assert summary["summary"] == "4 of 4 partitions done; of 40 planned rows: 38 processed, 2 skipped (dead letters)"
    assert (summary["planned"], summary["processed"], summary["skipped"], summary["shortfall"]) == (40, 38, 2, 0)
    # and the jobs listing and the CLI show the plan's rows and the dead letters beside the processed ones
    line = next(j for j in control.jobs() if j["job"] == "pt_skips.export")
    assert (line["planned"], line["processed"], line["skipped"]) == (40, 40, 2)


@pytest.mark.one_store("asserts the CLI's columns, read from the rows the store contract suite owns", kind="sqlite")
def test_the_jobs_command_shows_the_planned_and_the_skipped_rows(
    checkpoints: Store, source: Source, run_dag: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    table(source, ROWS)
    run_dag("pt_skips", conf={"bad": [13, 27]}, logical_date=DAY)
    code, out, err = resumable_cli("jobs", "--output", "json", capsys=capsys)
    assert code == 0, err
    line = next(j for j in json.loads(out) if j["job"] == "pt_skips.export")
    assert (line["planned"], line["skipped"]) == (40, 2)
    code, out, err = resumable_cli("jobs", capsys=capsys)
    assert code == 0 and "planned" in out and "skipped" in out, err


@pytest.mark.parametrize(("moved", "restored", "state", "shortfall", "gone"), [
    ([16, 17], [16, 17], "success", 2, 0),  # two rows unexplained: tolerated_shortfall=2 lets it succeed, saying so
    ([15, 16, 17], [15, 16, 17], "failed", 3, 0),  # three: the summary fails
    ([16, 17], [], "success", 0, 2),  # deleted after the plan: explained, no shortfall
], ids=["tolerated", "beyond", "deleted"])
def test_a_shortfall_nothing_explains_fails_the_summary_unless_tolerated_and_then_heads_it(
    checkpoints: Store, source: Source, run_dag: Any, capfd: pytest.CaptureFixture[str], moved: list[int],
    restored: list[int], state: str, shortfall: int, gone: int,
) -> None:
    # Given 40 rows planned in 4 partitions, and rows of partition 1's range deleted before it reads
    # them (and put back behind its position as it ends, or not)
    table(source, ROWS)

    # When the job runs
    run = run_dag("pt_moving", conf={"delete": moved, "restore": restored}, logical_date=DAY)
    log = [line for line in "".join(capfd.readouterr()).splitlines() if "PartitionSummaryOperator" in line]

    # Then the summary task succeeds or fails on the rows nothing explains
    summary_ti = run.get_task_instance("export.summary")
    assert (str(run.state), str(summary_ti.state)) == (state, state)
    with checkpoints.open() as s:
        assert s.checkpoints.load("pt_moving.export[1]", SLOT).processed == 10 - len(moved)
    if state == "success":
        summary = xcom(run, "export.summary", required=True)
        assert (summary["shortfall"], summary["gone"], summary["tolerated_shortfall"]) == (shortfall, gone, 2)
        tolerated = summary["summary"].startswith("SHORTFALL TOLERATED")
        assert tolerated == bool(shortfall)
        # and a tolerated shortfall is warned of in the task log, on the summary's first line
        warned = [line for line in log if "[warning" in line and "SHORTFALL TOLERATED" in line]
        assert bool(warned) == bool(shortfall), log
    else:
        failures = [line for line in log if "neither processed, skipped nor gone" in line]
        assert failures and "pt_moving.export[1]" in failures[0], log


def test_total_on_partitioned_is_each_partition_s_and_is_now_called_partition_total(airflow_home: Any) -> None:
    from airflow.sdk import DAG

    from airflow_resumable.core.readers import KeysetReader
    from airflow_resumable.operators.partitioned import partitioned

    reader = KeysetReader(connect=lambda: None, table="t", key="id")
    with DAG("pt_totals", schedule=None, start_date=DAY):
        with pytest.warns(DeprecationWarning, match="now called partition_total="):
            old = partitioned(task_id="old", read=reader, process=lambda ctx, batch: None, partitions=2, chunk_size=5,
                              total=7)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            new = partitioned(task_id="new", read=reader, process=lambda ctx, batch: None, partitions=2, chunk_size=5,
                              partition_total=7)
    for group in (old, new):
        mapped = group.children[f"{group.group_id}.partition"]
        assert mapped.partial_kwargs["total"] == 7
    from airflow_resumable.core.model.errors import ConfigurationError

    with DAG("pt_totals_both", schedule=None, start_date=DAY), pytest.warns(DeprecationWarning), \
            pytest.raises(ConfigurationError, match="give partition_total= only"):
        partitioned(task_id="both", read=reader, process=lambda ctx, batch: None, partitions=2, chunk_size=5,
                    total=7, partition_total=8)
