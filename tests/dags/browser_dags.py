"""The DAGs the browser test (tests/integration/browser/) watches in the UI: one slow resumable export, a
mapped one whose partition 1 fails (the jobs page's partitions and "Re-run failed partitions"), and
one whose runs share a job with overlap="skip" (the tab of the run that yielded), and a partitioned
job with a skip policy (a partition's "Retry skipped items"). The tab's skipped items and "Retry
skipped items" of a single task are the UI tour's own DAG's (dags/readings_import.py).

``items`` items (DAG run conf, default 60), ``chunk`` per checkpoint, ``delay`` seconds per item,
waiting on the run's signal (a pause or a cancel ends the wait at once). A short lease (3 s:
heartbeat every second) makes a pause take effect within about a second.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import DAG

from airflow_resumable import ResumableOperator, RunContext
from airflow_resumable.operators.partitioned import partitioned
from airflow_resumable.readers import sql_reader


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


def part_items(ctx: RunContext, *, n: int, fail: bool) -> int:
    ctx.total = n
    nxt = int(ctx.position or 0)
    while nxt < n:
        if fail and nxt == n // 2:
            raise ValueError(f"partition failed at {nxt} (on purpose)")
        nxt += 1
        ctx.checkpoint(nxt, processed=nxt)
    return nxt


with DAG(dag_id="ui_parts", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         tags=["resumable-tests"]):
    ResumableOperator.partial(task_id="part", handler=part_items, retries=0).expand(
        handler_kwargs=[{"n": 4, "fail": False}, {"n": 4, "fail": True}, {"n": 4, "fail": False}])


with DAG(dag_id="ui_overlap", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         tags=["resumable-tests"]):
    ResumableOperator(
        task_id="export", handler=export_items, lease=3, overlap="skip", retries=0, job="ui_overlap.shared",
        handler_kwargs={"items": "{{ dag_run.conf.get('items', 60) }}", "chunk": 2,
                        "delay": "{{ dag_run.conf.get('delay', 0.25) }}"},
    )


def copy_unless_refused(ctx: RunContext, batch: list[Any]) -> None:
    """Each row of ``ui_pt_source`` into ``ui_pt_sink``, in the checkpoint's transaction; a row whose
    id is listed in ``ui_pt_refused`` raises ValueError (the skip policy records it): delete it from
    there and a retry of the skipped items copies it."""
    tx = ctx.transaction()
    for (ident,) in batch:
        if tx.execute("SELECT id FROM ui_pt_refused WHERE id = %s", (ident,)).fetchone() is not None:
            raise ValueError(f"row {ident} is refused (listed in ui_pt_refused)")
        tx.execute("INSERT INTO ui_pt_sink (id) VALUES (%s) ON CONFLICT (id) DO NOTHING", (ident,))


with DAG(dag_id="ui_partitioned", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         tags=["resumable-tests"]):
    # The test creates the tables in the checkpoint store's own database (the resumable_default connection).
    partitioned(task_id="export", read=sql_reader("resumable_default", table="ui_pt_source", key="id"),
                process=copy_unless_refused, partitions=2, chunk_size=5, skip_on=ValueError, skip_limit=5, retries=0)
