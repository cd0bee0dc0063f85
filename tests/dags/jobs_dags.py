"""A mapped DAG whose partitions named in the run's conf (``fail_parts``) fail without a retry:
the per-job summary and the re-run of the failed partitions only (tests/unit/test_jobs.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import DAG, get_current_context

from airflow_resumable import ResumableOperator, RunContext


def part_of_three(ctx: RunContext, part: int) -> dict[str, Any]:
    conf = dict(get_current_context()["dag_run"].conf or {})
    ctx.total = 4
    i = ctx.position or 0
    while i < 4:
        if i == 2 and part in conf.get("fail_parts", ()):
            raise RuntimeError(f"partition {part} fails at item 2")
        i += 1
        ctx.checkpoint(i, processed=i)
    return {"part": part}


with DAG("rt_jobs_mapped", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False) as rt_jobs_mapped:
    ResumableOperator.partial(task_id="part", handler=part_of_three, retries=0).expand(
        handler_kwargs=[{"part": 0}, {"part": 1}, {"part": 2}]
    )
