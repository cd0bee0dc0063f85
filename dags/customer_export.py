"""Hourly customer export: keyset batches of 200 customers, resumed from the last exported id.

Every hour this DAG copies the ``customers`` table into the warehouse table
``warehouse_customers``, 200 customers at a time, in id order. After each batch the task saves a
checkpoint (the last exported id) for this run's slot. When the run is interrupted (a deploy, a
crash, the 50-minute timeout, someone marking it failed), Airflow's retry or a Clear continues
after that id instead of exporting everything again, and logs a warning naming the attempt and
where it continues.

**Connections**

* ``export_source``: the PostgreSQL database that holds ``customers``. When this connection
  does not exist, the export reads from the checkpoint database (``resumable_default``), so one
  PostgreSQL database is enough to try it.
* ``resumable_default``: the checkpoint store. The warehouse table lives here too.

The ``prepare_source`` task creates and fills ``customers`` (1,000 rows) when it is missing, so
the DAG runs on an empty database. Point ``export_source`` at your own table to export real data.

**Exactly once for the warehouse.** The warehouse table is in the checkpoint database, so each
batch is written through ``ctx.transaction()``: the batch and its checkpoint commit in one
database transaction. An interruption keeps both or neither, so no customer is exported twice,
not even the batch in flight. The write is still an upsert (``INSERT ... ON CONFLICT DO
UPDATE``), so running the same hour again (a Clear after success starts the slot over) updates
the rows in place. If your warehouse is another database, write each batch there with the same
upsert and commit it before ``ctx.checkpoint()``: an interruption between the two then repeats at
most that one batch, and the upsert makes the repeat harmless.

**Overlap.** ``overlap="skip"``: an hourly run that finds the previous hour's export still running
ends as *skipped*. The 50-minute ``timeout`` keeps a stuck export from blocking the hours after it:
the run stops at its next batch boundary and is retried from its checkpoint.

**Watching it resume.** Trigger the DAG with ``batch_pause_seconds`` (a DAG parameter, 0 by
default) set to a few seconds to slow it down; mark the running task failed or stop the worker,
then Clear the task: the new attempt logs ``attempt 2, continuing after <id>``. The pause waits on
the run's signal, so an interruption ends it at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import closing
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.sdk import DAG, BaseHook, Param, task
from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException

from airflow_resumable import ResumableOperator, RunContext

#: The connection of the database that holds ``customers``.
SOURCE_CONN_ID = "export_source"
#: The checkpoint store's connection: the warehouse table lives there, and it is the source too
#: when ``export_source`` does not exist.
CHECKPOINT_CONN_ID = "resumable_default"

BATCH_SIZE = 200
#: How many customers ``prepare_source`` creates when the table is missing.
CUSTOMER_COUNT = 1_000
COUNTRIES = ("DE", "FR", "NL", "PL", "TR", "US")

CUSTOMERS_DDL = """
CREATE TABLE IF NOT EXISTS customers (
    id BIGINT PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT NOT NULL,
    country TEXT NOT NULL
)"""

WAREHOUSE_DDL = """
CREATE TABLE IF NOT EXISTS warehouse_customers (
    id BIGINT PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT NOT NULL,
    country TEXT NOT NULL,
    export_slot TEXT NOT NULL,
    export_attempt INTEGER NOT NULL,
    exported_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP
)"""

# [START customer_export_upsert]
UPSERT = """
INSERT INTO warehouse_customers (id, name, email, country, export_slot, export_attempt)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (id) DO UPDATE SET
    name = excluded.name,
    email = excluded.email,
    country = excluded.country,
    export_slot = excluded.export_slot,
    export_attempt = excluded.export_attempt,
    exported_at = CURRENT_TIMESTAMP
"""
# [END customer_export_upsert]

Customer = tuple[int, str, str, str]


def source_connection() -> Any:
    """A psycopg2 connection to the customers' database (``export_source``, else ``resumable_default``)."""
    import psycopg2

    try:
        conn = BaseHook.get_connection(SOURCE_CONN_ID)
    except AirflowNotFoundException:
        conn = BaseHook.get_connection(CHECKPOINT_CONN_ID)
    if (conn.conn_type or "").lower() not in ("postgres", "postgresql"):
        raise AirflowFailException(
            f"the customer export reads customers from PostgreSQL, but the connection {conn.conn_id!r} has type "
            f"{conn.conn_type!r}. Create the connection {SOURCE_CONN_ID!r}, e.g. "
            f"AIRFLOW_CONN_{SOURCE_CONN_ID.upper()}='postgresql://user:password@host:5432/dbname'"
        )
    return psycopg2.connect(
        host=conn.host,
        port=conn.port,
        user=conn.login,
        password=conn.password,
        dbname=conn.schema,
        sslmode=conn.extra_dejson.get("sslmode"),  # None values are left out
    )


def prepare_customers() -> int:
    """Create ``customers`` with :data:`CUSTOMER_COUNT` rows if it is missing or empty; returns the row count."""
    with closing(source_connection()) as db, db, db.cursor() as cur:
        cur.execute(CUSTOMERS_DDL)
        cur.execute("SELECT count(*) FROM customers")
        if cur.fetchone()[0] == 0:
            cur.executemany(
                "INSERT INTO customers (id, name, email, country) VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                [
                    (i, f"Customer {i:04d}", f"customer{i}@example.com", COUNTRIES[i % len(COUNTRIES)])
                    for i in range(1, CUSTOMER_COUNT + 1)
                ],
            )
        cur.execute("SELECT count(*) FROM customers")
        return int(cur.fetchone()[0])


# [START customer_export_batch]
def customers_after(source: Any, after: int, limit: int) -> list[Customer]:
    """Keyset pagination: the next ``limit`` customers after id ``after``, in id order."""
    with source.cursor() as cur:
        cur.execute(
            "SELECT id, name, email, country FROM customers WHERE id > %s ORDER BY id LIMIT %s", (after, limit)
        )
        return list(cur.fetchall())


def export_batch(ctx: RunContext, batch: Sequence[Customer]) -> None:
    """Upsert one batch into the warehouse through the run's transaction.

    The rows commit together with the next ``ctx.checkpoint()``: both or neither.
    """
    # %s placeholders on both stores: ctx.transaction() translates them for a SQLite store.
    ctx.transaction().executemany(UPSERT, [(*customer, ctx.slot, ctx.attempt) for customer in batch])
# [END customer_export_batch]


# [START customer_export_handler]
def export_customers(ctx: RunContext, batch_pause_seconds: float | str = 0) -> None:
    """Export every customer once per run, :data:`BATCH_SIZE` at a time, from the last saved id."""
    # Progress of THIS run: attempt 2 finds what attempt 1 saved for the same slot.
    after = ctx.position or 0
    if ctx.attempt > 1:
        where = f"continuing after {after}" if ctx.resumed else "starting from the first customer"
        ctx.log.warning("export %s: attempt %s, %s", ctx.slot, ctx.attempt, where)
    pause = float(batch_pause_seconds or 0)
    ctx.transaction().execute(WAREHOUSE_DDL)  # commits with the first checkpoint

    with closing(source_connection()) as source:
        source.set_session(readonly=True, autocommit=True)
        if ctx.total is None:
            with source.cursor() as cur:
                cur.execute("SELECT count(*) FROM customers")
                ctx.total = cur.fetchone()[0]
        batch = customers_after(source, after, BATCH_SIZE)
        while batch:
            export_batch(ctx, batch)
            after = batch[-1][0]
            # Saves the position (and commits the batch's upsert with it), then stops if asked to.
            ctx.checkpoint(after, processed=ctx.processed + len(batch))
            batch = customers_after(source, after, BATCH_SIZE)
            if batch:  # only for watching it run (never after the last batch): wakes at once on a cancel
                ctx.signal.wait(pause)
            ctx.signal.raise_if_cancelled()  # a deploy, a timeout or the UI stops the run here
# [END customer_export_handler]


# [START customer_export_dag]
with DAG(
    dag_id="customer_export",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    tags=["resumable", "example"],
    doc_md=__doc__,
    params={
        "batch_pause_seconds": Param(
            0, type="number", minimum=0, description="Seconds to wait after each batch (to watch and interrupt a run)"
        ),
    },
) as dag:

    @task
    def prepare_source() -> int:
        """Create the demo ``customers`` table if it is missing."""
        return prepare_customers()

    export = ResumableOperator(
        task_id="export_customers",
        handler=export_customers,
        handler_kwargs={"batch_pause_seconds": "{{ params.batch_pause_seconds }}"},
        timeout=timedelta(minutes=50),  # the signal fires; the run stops at its next batch boundary
        overlap="skip",  # an hour whose export finds the previous hour's still running is skipped
        retries=3,
        retry_delay=timedelta(seconds=5),  # a retry resumes from the checkpoint: no need to wait long
    )

    prepare_source() >> export
# [END customer_export_dag]
