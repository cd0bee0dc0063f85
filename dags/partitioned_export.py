"""A partitioned export: one job over every order, in 4 partitions that run on any worker.

``partitioned(...)`` (``airflow_resumable.operators.partitioned``) turns one chunked job into a task group of three tasks:

* ``export_orders.plan`` splits the orders' key ``(placed_on, id)`` into 4 ranges of about
  equal size (quantiles of the key, counted by the database) when the run first starts, and stores
  the plan on the run's slot. Every retry and every Clear (of a partition, or of this task) reads
  the same ranges, even after new orders arrived: no order is in two partitions, none in none.
* ``export_orders.partition`` is mapped over the ranges: 4 mapped task instances, each its own
  job ``partitioned_export.export_orders[<i>]`` with its own checkpoint. A partition that fails
  retries from its own last batch; the others keep their work.
* ``export_orders.summary`` runs when all partitions have finished, whichever way: it fails when
  more partitions failed than ``tolerated_failure`` allows (here one in four: ``"25%"``), and
  returns the job's figures (partitions done and failed, orders processed and expected).

Each batch is upserted into ``orders_export`` through ``ctx.transaction()``, so it commits with its
partition's checkpoint: exactly once. ``prepare_orders`` creates and fills ``orders`` (2,000 rows,
most of them on a few days: ties on the key's first column) in the checkpoint database when the
table is missing, so the DAG runs on an empty database.

``partitioned_export_decorated`` is the same job declared with ``@task.resumable.partitioned`` on its
chunk function.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from datetime import date, datetime, timedelta, timezone
from typing import Any

from airflow.sdk import DAG, task

from airflow_resumable import RunContext
from airflow_resumable.operators.partitioned import partitioned
from airflow_resumable.readers import connect, sql_reader

#: The checkpoint store's connection: the orders and the export table live there too.
CONN_ID = "resumable_default"
ORDER_COUNT = 2_000


def order(i: int) -> tuple[int, str, int]:
    """Order ``i``: its day (most orders on five days) and amount in cents; deterministic stand-in data."""
    day = date(2026, 1, 1) + timedelta(days=(i % 5) if i % 10 else (i % 40))
    return i, day.isoformat(), (i * 7919) % 10_000 + 100


def setup_in_turn(conn: Any) -> None:
    """Open the setup's transaction holding a lock that a second run's setup waits for: two runs at
    once (two DAGs, or a scheduled run beside a manual one) would otherwise both find ``orders``
    empty and both fill it, and PostgreSQL's ``CREATE TABLE IF NOT EXISTS`` is not safe against a
    concurrent one (a unique violation on ``pg_type``). The lock ends with the transaction."""
    if isinstance(conn, sqlite3.Connection):
        conn.execute("BEGIN IMMEDIATE")  # SQLite's write lock, taken before the first read
    else:
        conn.cursor().execute("SELECT pg_advisory_xact_lock(hashtext('partitioned_export.prepare_orders'))")


# [START partitioned_export_process]
UPSERT = """
INSERT INTO orders_export (id, placed_on, amount_cents, partition_job)
VALUES (%s, %s, %s, %s)
ON CONFLICT (id) DO UPDATE SET
    placed_on = excluded.placed_on,
    amount_cents = excluded.amount_cents,
    partition_job = excluded.partition_job
"""


def export_batch(ctx: RunContext, batch: list[tuple[Any, ...]]) -> None:
    """Upsert one batch of orders, in the partition's checkpoint transaction."""
    tx = ctx.transaction()
    for order_id, placed_on, amount_cents in batch:
        tx.execute(UPSERT, (order_id, placed_on, amount_cents, ctx.job))
# [END partitioned_export_process]


# [START partitioned_export_dag]
with DAG(
    dag_id="partitioned_export",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    tags=["resumable", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def prepare_orders() -> int:
        """Create ``orders`` (filled) and ``orders_export`` when they are missing."""
        with closing(connect(CONN_ID)) as conn:
            mark = "?" if isinstance(conn, sqlite3.Connection) else "%s"
            setup_in_turn(conn)  # two runs at once set up one after the other
            cur = conn.cursor()
            cur.execute("CREATE TABLE IF NOT EXISTS orders_export (id BIGINT PRIMARY KEY, placed_on TEXT NOT NULL, "
                        "amount_cents BIGINT NOT NULL, partition_job TEXT NOT NULL)")
            cur.execute("CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, placed_on TEXT NOT NULL, "
                        "amount_cents BIGINT NOT NULL)")
            cur.execute("CREATE INDEX IF NOT EXISTS orders_key ON orders (placed_on, id)")
            cur.execute("SELECT count(*) FROM orders")
            if cur.fetchone()[0] == 0:
                cur.executemany(f"INSERT INTO orders VALUES ({mark}, {mark}, {mark})",
                                [order(i) for i in range(1, ORDER_COUNT + 1)])
            conn.commit()
        return ORDER_COUNT

    export = partitioned(
        task_id="export_orders",
        read=sql_reader(CONN_ID, table="orders", columns=("id", "placed_on", "amount_cents"), key=("placed_on", "id")),
        process=export_batch,
        partitions=4,
        chunk_size=100,
        tolerated_failure="25%",
        retries=2,
        retry_delay=timedelta(seconds=5),
        timeout=timedelta(minutes=30),
    )

    prepare_orders() >> export
# [END partitioned_export_dag]


# [START partitioned_export_decorated]
@task.resumable.partitioned(
    read=sql_reader(CONN_ID, table="orders", columns=("id", "placed_on", "amount_cents"), key=("placed_on", "id")),
    partitions=4,
    chunk_size=100,
    tolerated_failure="25%",
    retries=2,
    retry_delay=timedelta(seconds=5),
)
def export_orders(ctx: RunContext, batch: list[tuple[Any, ...]]) -> None:
    """The same job declared on its chunk function: each batch upserted in its partition's transaction."""
    export_batch(ctx, batch)


with DAG(
    dag_id="partitioned_export_decorated",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    tags=["resumable", "example"],
    doc_md="The partitioned export of `partitioned_export`, declared with `@task.resumable.partitioned`.",
) as decorated_dag:
    prepare_orders() >> export_orders()
# [END partitioned_export_decorated]
