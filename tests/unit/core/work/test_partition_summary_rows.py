"""A partitioned job's summary adds up only rows the decoder reads: a partition's row edited by hand
out of its columns' ranges fails the summary task with ``CorruptCheckpoint`` naming the partition,
the column and the fix, before any figure is reported. On both stores, through ``dag.test()``
(tests/dags/partition_dags.py)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_resumable.core.stores import Store
from support.partition_source import table
from support.sources import Source
from support.xcoms import xcom

DAY = datetime(2026, 3, 1, tzinfo=timezone.utc)
SLOT = DAY.isoformat()
ROWS = [("a" if i < 30 else "b", i) for i in range(40)]
JOB = "pt_tolerant.export"


@pytest.mark.parametrize(("column", "value"), [("processed", -5), ("total", -10)])
def test_a_done_partition_edited_into_a_negative_count_fails_the_summary_naming_it(
    checkpoints: Store, source: Source, run_dag: Any, capsys: pytest.CaptureFixture[str], column: str, value: int
) -> None:
    """Before: the summary succeeded over it (total -10: the job's total 20; processed -5: 15 short of
    the plan and tolerated nowhere, yet counted), and the summary's lineage facet failed its schema."""
    # Given a run whose four partitions are done
    table(source, ROWS)
    first = run_dag("pt_tolerant", logical_date=DAY)
    assert str(first.state) == "success"
    assert xcom(first, "export.summary", required=True)["processed"] == 40
    # and partition 0's row then edited by hand
    with checkpoints.open() as s:
        s.execute(f"UPDATE resumable_checkpoints SET {column} = %s WHERE job = %s", (value, f"{JOB}[0]"))
        s.commit()
    capsys.readouterr()

    # When the run runs again
    again = run_dag("pt_tolerant", logical_date=DAY)

    # Then the summary fails, naming the partition's row, the column and the fix; it reports no figure
    assert str(again.get_task_instance("export.summary").state) == "failed"
    said = capsys.readouterr().out
    assert "CorruptCheckpoint" in said and f"the stored {column} {value} is out of the column's range" in said, \
        said[-3000:]
    assert f"job='{JOB}[0]'" in said and f"UPDATE resumable_checkpoints SET {column} = " in said
    assert xcom(again, "export.summary") is None
    with checkpoints.open() as s:  # the row is left as it is
        assert s.execute(f"SELECT {column} FROM resumable_checkpoints WHERE job = %s",
                         (f"{JOB}[0]",)).fetchone()[0] == value
