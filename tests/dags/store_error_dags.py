"""DAGs for tests/unit/core/stores/test_store_errors.py and tests/unit/core/readers/test_file_positions.py: errors that say what
happened, as Airflow shows them.

conf keys: ``admin_dsn`` (a libpq DSN the handler terminates its own backend through, from another
session, on the first try), ``path`` (the file the reader reads), ``rotate`` (a file moved over
``path`` by the first try, before it fails: a rotated log).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, get_current_context

from airflow_resumable import ChunkedOperator, ResumableOperator, RunContext
from airflow_resumable.core.readers import FileReader

START = datetime(2026, 1, 1)
ONE_RETRY = {"retries": 1, "retry_delay": timedelta(0)}
ITEMS, CHUNK = 20, 5


def _conf() -> dict[str, Any]:
    return dict(get_current_context()["dag_run"].conf or {})


def lose_the_connection_once(ctx: RunContext) -> int:
    """Items 0..19, five a chunk, through ctx.transaction(); on the first try an administrator's
    session terminates the attempt's backend during chunk 3, before its checkpoint."""
    import psycopg2

    i = ctx.position or 0
    tx = ctx.transaction()
    tx.execute("CREATE TABLE IF NOT EXISTS sink (item INTEGER PRIMARY KEY, attempt INTEGER NOT NULL)")
    while i < ITEMS:
        cur = ctx.transaction().cursor()
        for item in range(i, i + CHUNK):
            cur.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (item, ctx.attempt))
        if ctx.attempt == 1 and i == 2 * CHUNK:
            cur.execute("SELECT pg_backend_pid()")
            pid = cur.fetchone()[0]
            with psycopg2.connect(_conf()["admin_dsn"]) as admin, admin.cursor() as other:
                other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        i += CHUNK
        ctx.checkpoint(i, processed=i)
    return i


with DAG("se_lost_connection", schedule=None, start_date=START, catchup=False) as se_lost_connection:
    ResumableOperator(task_id="work", handler=lose_the_connection_once, **ONE_RETRY)


def _open_path() -> Any:
    return open(_conf()["path"], "rb")


def rotate_then_fail(ctx: RunContext, batch: list[str]) -> None:
    """Takes each batch; on the first try, at the third one, the log is rotated (a new file moved
    over the path) and the try fails before its checkpoint."""
    conf = _conf()
    if ctx.attempt == 1 and ctx.processed >= 2 * CHUNK:
        os.replace(conf["rotate"], conf["path"])
        raise RuntimeError("the worker died")


with DAG("se_file_rotated", schedule=None, start_date=START, catchup=False) as se_file_rotated:
    ChunkedOperator(task_id="work", read=FileReader(open=_open_path, name="app.log"), process=rotate_then_fail,
                    chunk_size=CHUNK, **ONE_RETRY)
