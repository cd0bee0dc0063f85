"""Hourly customer export: the customers changed since the last export, 200 at a time, resumable.

Every hour this DAG copies the customers **changed since the previous export** into the warehouse
table ``warehouse_customers``, 200 at a time, in ``(updated_at, id)`` order. The first export
sends every customer; each later hour starts where the last finished one ended
(``ctx.previous.position``: its final key). After each batch the task saves a checkpoint (the
last exported key) for this run's slot. When the run is interrupted (a deploy, a crash, the
50-minute timeout, someone marking it failed), Airflow's retry or a Clear continues after that key
instead of exporting everything again, and logs a warning naming the attempt and where it continues.

**Reading correctly.** The customers are read by a ready-made keyset reader on the composite key
``(updated_at, id)``: many customers change in the same transaction and share an ``updated_at``,
and the row-value comparison ``(updated_at, id) > (%s, %s)`` neither skips nor repeats them at a
batch boundary. The index ``customers_updated (updated_at, id)`` makes every batch one index range
scan, however far into the table it starts.

**Which export is "previous".** The latest hour before this one whose export finished (``done``).
A failed or still running hour does not count: the next hour starts from the last one that
finished, so nothing is left out. A backfill of an older hour starts from the hour before *it*,
not from the newest export; a Clear of a successful hour starts it over from the hour before.
Hours that overlap re-send some customers, which the upsert makes harmless. Not covered: a
customer committed with an ``updated_at`` *older* than the last export's end (a long transaction
that set it early) is missed; set ``updated_at`` at commit time (a trigger) if your writers do that.

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
UPDATE``), so running the same hour again updates the rows in place. If your warehouse is another
database, write each batch there with the same upsert and commit it before ``ctx.checkpoint()``:
an interruption between the two then repeats at most that one batch, and the upsert makes the
repeat harmless.

**Overlap.** ``overlap="skip"``: an hourly run that finds the previous hour's export still running
ends as *skipped* (the next hour then exports its changes too). The 50-minute ``timeout`` keeps a
stuck export from blocking the hours after it: the run stops at its next batch boundary and is
retried from its checkpoint.

**Watching it resume.** Trigger the DAG with ``full`` set (every customer, not only the changed
ones) and ``batch_pause_seconds`` (a DAG parameter, 0 by default) set to a few seconds to slow it down; mark the running task failed or stop the worker,
then Clear the task: the new attempt logs ``attempt 2, continuing after customer <id>``. The pause
waits on the run's signal, so an interruption ends it at once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import closing
from datetime import datetime, timedelta, timezone
from typing import Any

# The exceptions from where Airflow 3.1 to 3.3 all have them (the common-compat provider comes with Airflow).
from airflow.providers.common.compat.sdk import AirflowFailException, AirflowNotFoundException
from airflow.sdk import DAG, BaseHook, Param, task

from airflow_resumable import ResumableOperator, RunContext
from airflow_resumable.readers import KeysetReader, connect

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
    country TEXT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS customers_updated ON customers (updated_at, id)"""

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

Customer = tuple[int, str, str, str, datetime]


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


#: The advisory lock two runs' setups take in turn (the hour's scheduled run beside a manual one):
#: PostgreSQL's ``CREATE TABLE IF NOT EXISTS`` is not safe against a concurrent one (a unique
#: violation on ``pg_type``), and both would find ``customers`` empty and fill it.
SETUP_LOCK = "SELECT pg_advisory_xact_lock(hashtext('customer_export.prepare_source'))"


def prepare_customers() -> int:
    """Create ``customers`` with :data:`CUSTOMER_COUNT` rows if it is missing or empty; returns the row count."""
    with closing(source_connection()) as db, db, db.cursor() as cur:
        cur.execute(SETUP_LOCK)  # held until this transaction ends: a second run's setup waits
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


def prepare_warehouse() -> None:
    """Create ``warehouse_customers`` in the checkpoint store if it is missing, before any run's
    handler does (its own ``CREATE TABLE IF NOT EXISTS`` is then a no-op, whatever runs beside it)."""
    with closing(connect(CHECKPOINT_CONN_ID)) as db:
        if isinstance(db, sqlite3.Connection):
            db.execute(WAREHOUSE_DDL)  # SQLite creates a table under its write lock: one at a time
        else:
            with db.cursor() as cur:
                cur.execute(SETUP_LOCK)
                cur.execute(WAREHOUSE_DDL)
        db.commit()


# [START customer_export_batch]
#: The customers in (updated_at, id) order, after the last exported key: a keyset reader on a
#: composite key, so customers sharing an updated_at are neither skipped nor repeated.
CUSTOMERS = KeysetReader(
    connect=source_connection,
    table="customers",
    columns=("id", "name", "email", "country", "updated_at"),
    key=("updated_at", "id"),
)


def export_batch(ctx: RunContext, batch: Sequence[Customer]) -> None:
    """Upsert one batch into the warehouse through the run's transaction.

    The rows commit together with the next ``ctx.checkpoint()``: both or neither.
    """
    # %s placeholders on both stores: ctx.transaction() translates them for a SQLite store.
    rows = [(cid, name, email, country, ctx.slot, ctx.attempt) for cid, name, email, country, _ in batch]
    ctx.transaction().executemany(UPSERT, rows)
# [END customer_export_batch]


# [START customer_export_handler]
def export_customers(ctx: RunContext, batch_pause_seconds: float | str = 0, full: bool | str = False) -> None:
    """Export the customers changed since the last export (all of them with ``full``), :data:`BATCH_SIZE` at a time."""
    if ctx.position is None and ctx.previous is not None and str(full).lower() not in ("true", "1"):
        # A new hour starts where the last finished export ended: only what changed since is sent.
        # Saved at once, so an hour in which nothing changed ends there too, for the next hour.
        ctx.checkpoint(ctx.previous.position)
    if ctx.attempt > 1:
        where = f"continuing after customer {ctx.position[1]}" if ctx.resumed and ctx.position else "starting over"
        ctx.log.warning("export %s: attempt %s, %s", ctx.slot, ctx.attempt, where)
    pause = float(batch_pause_seconds or 0)
    ctx.transaction().execute(WAREHOUSE_DDL)  # commits with the next checkpoint
    if ctx.total is None:
        ctx.total = ctx.processed + CUSTOMERS.count(ctx, ctx.position)
    # Each batch: the customers after ctx.position (this run's checkpoint), read by the index.
    for number, batch in enumerate(CUSTOMERS.chunks(ctx, BATCH_SIZE)):
        if number:  # only for watching it run, between batches (never after the last): wakes at once on a cancel
            ctx.signal.wait(pause)
            ctx.signal.raise_if_cancelled()
        export_batch(ctx, batch)
        # Saves the position (and commits the batch's upsert with it), then stops if asked to.
        ctx.checkpoint(batch.position, processed=ctx.processed + len(batch))
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
            0, type="number", minimum=0, description="Seconds to wait between two batches (to watch and interrupt a run)"
        ),
        "full": Param(False, type="boolean", description="Export every customer, not only those changed since "
                      "the last export"),
    },
) as dag:

    @task
    def prepare_source() -> int:
        """Create the demo ``customers`` table and the warehouse table if they are missing."""
        prepare_warehouse()
        return prepare_customers()

    export = ResumableOperator(
        task_id="export_customers",
        handler=export_customers,
        handler_kwargs={"batch_pause_seconds": "{{ params.batch_pause_seconds }}", "full": "{{ params.full }}"},
        timeout=timedelta(minutes=50),  # the signal fires; the run stops at its next batch boundary
        overlap="skip",  # an hour whose export finds the previous hour's still running is skipped
        retries=3,
        retry_delay=timedelta(seconds=5),  # a retry resumes from the checkpoint: no need to wait long
    )

    prepare_source() >> export
# [END customer_export_dag]
