"""The DAGs the browser test (tests/test_browser.py) watches in the UI: one slow resumable export,
and a chunked one whose odd items fail (skipped, for the tab's "Retry skipped items").

``items`` items (DAG run conf, default 60), ``chunk`` per checkpoint, ``delay`` seconds per item,
waiting on the run's signal (a pause or a cancel ends the wait at once). A short lease (3 s:
heartbeat every second) makes a pause take effect within about a second.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import DAG

from airflow_resumable import ChunkedOperator, ResumableOperator, RunContext


def export_items(ctx: RunContext, *, items: Any, chunk: Any, delay: Any) -> int:
    items, chunk, delay = int(items), int(chunk), float(delay)
    ctx.total = items
    nxt = int(ctx.position or 0)
    while nxt < items:
        end = min(nxt + chunk, items)
        for _ in range(nxt, end):
            ctx.signal.wait(delay)
        nxt = end
        ctx.checkpoint(nxt, processed=nxt)
    return nxt


with DAG(dag_id="ui_export", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         tags=["resumable-tests"]):
    ResumableOperator(
        task_id="export", handler=export_items, lease=3, overlap="allow", retries=0, resume_poll=0.5,
        progress_interval=2,
        handler_kwargs={"items": "{{ dag_run.conf.get('items', 60) }}", "chunk": 2,
                        "delay": "{{ dag_run.conf.get('delay', 0.25) }}"},
    )


def read_numbers(ctx: RunContext, after: Any, limit: int) -> list[dict[str, int]]:
    first = int(after or 0) + 1
    return [{"id": i} for i in range(first, min(first + limit, 13))]


def even_only(ctx: RunContext, batch: list[dict[str, int]]) -> None:
    for item in batch:
        if item["id"] % 4 == 3:
            raise ValueError(f"item {item['id']} is not accepted")


with DAG(dag_id="ui_skips", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         tags=["resumable-tests"]):
    ChunkedOperator(task_id="numbers", read=read_numbers, process=even_only, chunk_size=4, total=12,
                    skip_on=ValueError, skip_limit=10, retries=0)
