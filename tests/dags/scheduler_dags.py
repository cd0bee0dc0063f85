"""DAGs driven by a real scheduler in tests/integration/test_scheduler.py (``airflow standalone``).

``sched_slow`` runs one ResumableOperator whose handler works through ``items`` numbered items,
``chunk`` at a time, slowly (``delay`` seconds per item, waiting on the run's signal), so that the
tests can mark it failed, clear it, and signal or kill its processes while it runs.

Each finished item is written to ``sched_items`` through ``ctx.transaction()``: the write commits
with the chunk's checkpoint, so ``writes`` counts how often an item was *committed* (exactly once).
Each item the handler *starts* is also logged to ``sched_seen`` on a separate autocommit connection,
outside the checkpoint's transaction: that log shows how much work a crash made an attempt repeat.
Both tables live in the checkpoint database (connection ``resumable_default``, PostgreSQL) and are
created by the test.

The file imports cleanly anywhere (only Airflow and the provider at import time).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, task

from airflow_resumable import ResumableOperator, RunContext

SEEN_TABLE = "sched_seen"
ITEMS_TABLE = "sched_items"


def _seen_log() -> Any:
    """An autocommit connection to the checkpoint database, for the side-effect log (or None)."""
    uri = os.environ.get("AIRFLOW_CONN_RESUMABLE_DEFAULT", "")
    if not uri.startswith(("postgresql://", "postgres://")):
        return None
    import psycopg2

    conn = psycopg2.connect(uri.replace("postgres://", "postgresql://", 1))
    conn.autocommit = True
    return conn


def work_items(ctx: RunContext, *, items: Any, chunk: Any, delay: Any) -> dict[str, Any]:
    """Process items ``0 .. items-1`` from the checkpoint on; the position is the next item."""
    items, chunk, delay = int(items), int(chunk), float(delay)
    seen = _seen_log()
    tx = ctx.transaction()
    nxt = 0 if ctx.position is None else int(ctx.position)
    try:
        while nxt < items:
            batch = list(range(nxt, min(nxt + chunk, items)))
            for item in batch:
                if seen is not None:
                    seen.cursor().execute(
                        f"INSERT INTO {SEEN_TABLE} (job, slot, item, attempt) VALUES (%s, %s, %s, %s)",
                        (ctx.job, ctx.slot, item, ctx.attempt),
                    )
                ctx.signal.wait(delay)
                # A cancel drops the unfinished chunk (its writes roll back with it).
                ctx.signal.raise_if_cancelled()
                tx.execute(
                    f"INSERT INTO {ITEMS_TABLE} (job, slot, item, writes, attempt) VALUES (%s, %s, %s, 1, %s) "
                    f"ON CONFLICT (job, slot, item) DO UPDATE SET writes = {ITEMS_TABLE}.writes + 1, "
                    "attempt = EXCLUDED.attempt",
                    (ctx.job, ctx.slot, item, ctx.attempt),
                )
            nxt = batch[-1] + 1
            ctx.checkpoint(nxt, processed=ctx.processed + len(batch), total=items)
    finally:
        if seen is not None:
            seen.close()
    return {"items": items, "resumed_from": ctx.resumed_from, "attempt": ctx.attempt}


with DAG(
    dag_id="sched_slow",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 3, "retry_delay": timedelta(seconds=2)},
    tags=["resumable-tests"],
):
    ResumableOperator(
        task_id="work",
        handler=work_items,
        # A short lease: after a SIGKILL the retry takes the slot over within a few seconds.
        lease=4,
        overlap="allow",
        progress_interval=2,
        xcom_interval=1,
        handler_kwargs={
            "items": "{{ dag_run.conf.get('items', 60) }}",
            "chunk": "{{ dag_run.conf.get('chunk', 2) }}",
            "delay": "{{ dag_run.conf.get('delay', 0.2) }}",
        },
    )


with DAG(
    dag_id="sched_mapped",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    default_args={"retries": 3, "retry_delay": timedelta(seconds=2)},
    tags=["resumable-tests"],
):
    # Two mapped task instances: jobs ``sched_mapped.work[0]`` and ``sched_mapped.work[1]``.
    ResumableOperator.partial(
        task_id="work", handler=work_items, lease=4, overlap="allow", progress_interval=2, xcom_interval=1
    ).expand(handler_kwargs=[{"items": 80, "chunk": 2, "delay": 0.2}, {"items": 80, "chunk": 2, "delay": 0.2}])


def fail_after_done(context: Any, result: Any) -> None:
    """After execute() returned (the slot is done) and before Airflow records success: the
    end-of-run window, as an API error or a kill would hit it."""
    if context["dag_run"].conf.get("fail_after_done") and context["ti"].try_number == 1:
        raise RuntimeError("injected failure after the slot was done")


with DAG(
    dag_id="sched_end",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["resumable-tests"],
):
    # No retries: the task instance ends failed after its slot is done, and a person Clears it.
    ResumableOperator(
        task_id="work",
        handler=work_items,
        lease=4,
        overlap="allow",
        retries=0,
        post_execute=fail_after_done,
        handler_kwargs={"items": "{{ dag_run.conf['items'] }}", "chunk": 2, "delay": 0.05},
    )


#: A pool of one worker slot: while ``sched_pause`` is paused (deferred), ``sched_pool_other`` runs in it.
POOL = "resumable_pool_one"


def throttle_twice(ctx: RunContext) -> float | None:
    """A wait long enough to defer after the chunks that end at items 10 and 20."""
    return 3.0 if ctx.processed in (10, 20) else None


with DAG(
    dag_id="sched_pause",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["resumable-tests"],
):
    # Heartbeats every second (lease / 3): a pause is seen within a second, acted on at the chunk's end.
    ResumableOperator(
        task_id="work", handler=work_items, lease=3, overlap="allow", retries=0, pool=POOL, resume_poll=0.5,
        progress_interval=2, xcom_interval=1,
        handler_kwargs={"items": "{{ dag_run.conf.get('items', 60) }}", "chunk": 2, "delay": 0.2},
    )

with DAG(dag_id="sched_pool_other", schedule=None, start_date=datetime(2024, 1, 1), catchup=False,
         tags=["resumable-tests"]):

    @task(pool=POOL)
    def meanwhile() -> str:
        return "ran in the pool while the resumable task was paused"

    meanwhile()

with DAG(dag_id="sched_throttle", schedule=None, start_date=datetime(2024, 1, 1), catchup=False,
         tags=["resumable-tests"]):
    ResumableOperator(
        task_id="work", handler=work_items, lease=3, overlap="allow", retries=0, throttle=throttle_twice,
        defer_after=1, resume_poll=0.5,
        handler_kwargs={"items": 30, "chunk": 2, "delay": 0.05},
    )

with DAG(dag_id="sched_slices", schedule=None, start_date=datetime(2024, 1, 1), catchup=False,
         tags=["resumable-tests"]):
    ResumableOperator(
        task_id="work", handler=work_items, lease=3, overlap="allow", retries=0, max_runtime=1.5, resume_poll=0.5,
        handler_kwargs={"items": 30, "chunk": 2, "delay": 0.1},
    )
