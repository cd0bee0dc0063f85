"""A skewed partitioned job, for rebalancing through a real scheduler
(tests/integration/test_rebalance_scheduler.py).

``skew_orders`` holds 400 ids in the checkpoint store's own database; 4 partitions of 100 each, but
every row of the first quarter (ids 1..100, partition 0) costs 25x the others (10 s in all, so that
the others start and finish while it runs, even on a loaded machine). The other partitions
finish early and take the upper half of what partition 0 has left, again and again. Every row is
written into ``skew_export (id, job)`` through ``ctx.transaction()``.
"""

from __future__ import annotations

import time
from contextlib import closing
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, task

from airflow_resumable import RunContext
from airflow_resumable.operators.partitioned import partitioned
from airflow_resumable.readers import connect, sql_reader

CONN_ID = "resumable_default"
ROWS, SLOW_UP_TO = 400, 100
FAST, SLOW = 0.004, 0.1


def export_rows(ctx: RunContext, batch: list[tuple[Any, ...]]) -> None:
    tx = ctx.transaction()
    for (order_id,) in batch:
        time.sleep(SLOW if order_id <= SLOW_UP_TO else FAST)
        tx.execute("INSERT INTO skew_export (id, job) VALUES (%s, %s)", (order_id, ctx.job))


with DAG(dag_id="rebalance_skewed", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:

    @task
    def prepare() -> None:
        with closing(connect(CONN_ID)) as conn:
            cur = conn.cursor()
            cur.execute("CREATE TABLE IF NOT EXISTS skew_orders (id INTEGER PRIMARY KEY)")
            cur.execute("CREATE TABLE IF NOT EXISTS skew_export (id INTEGER NOT NULL, job TEXT NOT NULL)")
            cur.execute("INSERT INTO skew_orders (id) SELECT g FROM generate_series(1, %s) AS g "
                        "ON CONFLICT DO NOTHING", (ROWS,))
            conn.commit()

    prepare() >> partitioned(task_id="export", read=sql_reader(CONN_ID, table="skew_orders", key="id"),
                             process=export_rows, partitions=4, chunk_size=5, retries=0)
