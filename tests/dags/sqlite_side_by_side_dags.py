"""A partitioned job on the embedded store (SQLite), as a new user first writes one, in a test-sized
form (tests/integration/test_sqlite_side_by_side.py).

Four partitions side by side over ``side_orders`` (160 rows) in the checkpoint store's own file,
chunks of 10, a skip policy, every row written through ``ctx.transaction()`` and slowed to 0.15 s:
each chunk holds SQLite's write lock for about 1.5 s, longer than the connection's busy timeout
(1 s, set by the test), and the chunk with the bad row (id 57, ``ValueError``) holds it about 3 s
while it is replayed item by item, longer than the 2 s lease.
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
ROWS = 160
BAD = 57
SECONDS_PER_ROW = 0.15


def export_row(ctx: RunContext, batch: list[tuple[Any, ...]]) -> None:
    tx = ctx.transaction()
    for order_id, amount in batch:
        time.sleep(SECONDS_PER_ROW)
        if order_id == BAD:
            raise ValueError(f"order {order_id} is malformed")
        tx.execute("INSERT INTO side_export (id, amount, part) VALUES (%s, %s, %s)",
                   (order_id, amount, ctx.job.rsplit("[", 1)[1].split("]")[0]))


with DAG(dag_id="sqlite_side_by_side", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:

    @task
    def prepare() -> None:
        with closing(connect(CONN_ID)) as conn:
            cur = conn.cursor()
            cur.execute("CREATE TABLE IF NOT EXISTS side_orders (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
            cur.execute("CREATE TABLE IF NOT EXISTS side_export (id INTEGER NOT NULL, amount INTEGER NOT NULL, "
                        "part TEXT NOT NULL)")
            cur.execute("INSERT OR IGNORE INTO side_orders VALUES " + ", ".join(f"({i}, {i * 3})"
                                                                                  for i in range(1, ROWS + 1)))
            conn.commit()

    prepare() >> partitioned(
        task_id="export",
        read=sql_reader(CONN_ID, table="side_orders", columns=("id", "amount"), key=("id",)),
        process=export_row,
        partitions=4,
        chunk_size=10,
        skip_on=(ValueError,),
        tolerated_failure=1,
        lease=2.0,
        retries=0,
    )
