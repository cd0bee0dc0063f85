"""Errors of the checkpoint store that say what happened (issue 31): a connection lost mid-run or
while the end is recorded, a read-only SQLite file or folder, ``file:`` URIs, a writer that waited
for SQLite's write lock past its busy timeout (naming the holder), each on a real database.

A lost connection is PostgreSQL's (``pg_terminate_backend`` from another session: a SQLite file has
no server to lose), so those tests run on PostgreSQL only; the read-only file, ``file:`` URIs and
the write lock are SQLite's own, so those run on SQLite only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from airflow_resumable.core import Attempt, Options
from airflow_resumable.core.errors import ConfigurationError, StoreUnavailable
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store

JOB, SLOT = "errors.store", "2026-03-01T00:00:00+00:00"
ITEMS, CHUNK = 20, 5


# -- helpers --------------------------------------------------------------------------------------


def _make_sink(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        s.execute("CREATE TABLE sink (item INTEGER NOT NULL, attempt INTEGER NOT NULL)")
        s.commit()


def _sink(store: Store) -> list[int]:
    with store.open() as s:
        items = [int(r[0]) for r in s.execute("SELECT item FROM sink ORDER BY item").fetchall()]
        s.commit()
    return items


def _row(store: Store, job: str = JOB, slot: str = SLOT) -> Any:
    with store.open() as s:
        return s.checkpoints.load(job, slot)


def _history(store: Store, job: str = JOB, slot: str = SLOT) -> list[Any]:
    with store.open() as s:
        return s.listings.history(job, slot)


def _terminator(pg_params: dict[str, Any]) -> Any:
    """Another session, as an administrator would use one: terminates a backend by its pid."""
    admin = psycopg2.connect(**pg_params)
    admin.autocommit = True

    def terminate(pid: int) -> None:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
            assert cur.fetchone()[0] is True

    terminate.close = admin.close  # type: ignore[attr-defined]
    return terminate


def _backend_pid(ctx: Any) -> int:
    cur = ctx.transaction().cursor()
    cur.execute("SELECT pg_backend_pid()")
    return int(cur.fetchone()[0])


def _writer(terminate: Any, *, kill_in_chunk: int | None = None, kill_after_last: bool = False,
            write_after_last: bool = False) -> Any:
    """Items 0..19, five a chunk, each written through ctx.transaction() with its checkpoint. On
    attempt 1 the attempt's own backend is terminated from another session: after chunk
    ``kill_in_chunk``'s writes (before its checkpoint), or after the last checkpoint (``kill_after_last``,
    with one more write through ctx.transaction() first when ``write_after_last``)."""

    def handler(ctx: Any) -> int:
        i = ctx.position or 0
        ctx.total = ITEMS
        while i < ITEMS:
            tx = ctx.transaction()
            for item in range(i, i + CHUNK):
                tx.execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (item, ctx.attempt))
            if ctx.attempt == 1 and kill_in_chunk == i // CHUNK:
                terminate(_backend_pid(ctx))
            i += CHUNK
            ctx.checkpoint(i, processed=i)
        if ctx.attempt == 1 and kill_after_last:
            pid = _backend_pid(ctx)
            if write_after_last:  # a write after the last checkpoint, which commits with "done"
                ctx.transaction().execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (ITEMS, ctx.attempt))
            terminate(pid)
        elif write_after_last:
            ctx.transaction().execute("INSERT INTO sink (item, attempt) VALUES (%s, %s)", (ITEMS, ctx.attempt))
        return i

    return handler


# -- a lost connection ----------------------------------------------------------------------------


def test_a_backend_terminated_mid_chunk_fails_the_attempt_naming_the_loss_and_records_it_for_the_retry(
    pg_params: dict[str, Any],
) -> None:
    # Given a run writing through ctx.transaction(), whose connection's backend is terminated by an
    # administrator's session after chunk 3's writes, before its checkpoint (the store's DSN carries
    # a password, as a production one does)
    store = PostgresStore(**pg_params, password="s3cr3t-pw")
    _make_sink(store)
    terminate = _terminator(pg_params)
    try:
        with pytest.raises(StoreUnavailable) as caught:
            Attempt(store, job=JOB, slot=SLOT, attempt=1, owner="a1").run(_writer(terminate, kill_in_chunk=2))
    finally:
        terminate.close()
    # Then the attempt fails with StoreUnavailable naming the lost connection, the job and the slot,
    # the driver's own error chained as its cause (not replaced by "connection already closed")
    error = caught.value
    text = str(error)
    assert "lost the connection to the checkpoint database" in text and "OperationalError" in text, text
    assert f"job='{JOB}'" in text and f"slot='{SLOT}'" in text and "A retry resumes from the last checkpoint" in text
    assert isinstance(error.__cause__, psycopg2.OperationalError)
    assert "s3cr3t-pw" not in text
    # and the row says so, written through a new connection: failed, not "running" until its lease
    # runs out, with its checkpoint after chunk 2 and its lease given back
    row = _row(store)
    assert (row.status, row.position, row.processed, row.lease_owner) == ("failed", 10, 10, None)
    assert "lost the connection" in row.last_error and "s3cr3t-pw" not in row.last_error
    assert _history(store)[-1].outcome == "failed" and "lost the connection" in _history(store)[-1].error
    assert _sink(store) == list(range(10))  # chunk 3's writes went with the connection
    # When the retry runs, then it resumes from that checkpoint and writes every item once
    out = Attempt(store, job=JOB, slot=SLOT, attempt=2, owner="a2").run(_writer(terminate))
    assert out.resumed_from == 10 and out.checkpoint.status == "done"
    assert _sink(store) == list(range(ITEMS))


class _FirstConnection(PostgresStore):
    """The store, remembering the first connection it opens: the attempt's own (the lease keeper's
    comes later)."""

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.opened: list[Any] = []

    def connect(self, *, autocommit: bool = False) -> Any:
        conn = super().connect(autocommit=autocommit)
        self.opened.append(conn)
        return conn


def test_a_backend_terminated_before_the_end_is_recorded_records_done_through_a_new_connection(
    pg_params: dict[str, Any],
) -> None:
    # Given a run whose checkpoints each committed alone (no ctx.transaction()), and whose
    # connection's backend is terminated after the last checkpoint, before "done" is recorded
    store = _FirstConnection(**pg_params)
    terminate = _terminator(pg_params)

    def handler(ctx: Any) -> int:
        i = ctx.position or 0
        while i < ITEMS:
            i += CHUNK
            ctx.checkpoint(i, processed=i)
        terminate(store.opened[0].get_backend_pid())
        return i

    try:
        out = Attempt(store, job=JOB, slot=SLOT, attempt=1, owner="a1").run(handler)
    finally:
        terminate.close()
    # Then nothing can have been pending on the lost connection: "done" is recorded through a new one
    assert store.opened[0].closed and out.checkpoint.status == "done" and out.result == ITEMS
    row = _row(store)
    assert (row.status, row.position, row.lease_owner, row.last_error) == ("done", ITEMS, None, None)
    assert _history(store)[-1].outcome == "done"


def test_a_backend_terminated_with_writes_pending_for_the_end_never_records_done_over_them(
    pg_params: dict[str, Any],
) -> None:
    # Given a handler that writes one more item through ctx.transaction() after its last checkpoint
    # (it commits with "done"), and whose backend is terminated before "done" is recorded
    store = PostgresStore(**pg_params)
    _make_sink(store)
    terminate = _terminator(pg_params)
    try:
        with pytest.raises(StoreUnavailable, match="lost the connection") as caught:
            Attempt(store, job=JOB, slot=SLOT, attempt=1, owner="a1").run(
                _writer(terminate, kill_after_last=True, write_after_last=True))
    finally:
        terminate.close()
    # Then the write went with the connection, so the slot is not "done": it is failed, saying why
    assert isinstance(caught.value.__cause__, psycopg2.Error)
    row = _row(store)
    assert (row.status, row.position, row.lease_owner) == ("failed", ITEMS, None)
    assert "lost the connection" in row.last_error
    assert _sink(store) == list(range(ITEMS))
    # and the retry resumes at the last checkpoint, redoes the write after it, and ends done
    out = Attempt(store, job=JOB, slot=SLOT, attempt=2, owner="a2").run(_writer(terminate, write_after_last=True))
    assert out.checkpoint.status == "done"
    assert _sink(store) == list(range(ITEMS + 1))


@pytest.mark.one_store("a terminated backend is PostgreSQL's: a SQLite file has no server to lose", kind="postgres")
def test_a_terminated_backend_fails_the_try_as_retryable_and_the_retry_resumes_through_airflow(
    checkpoints: Store, run_dag, pg_params: dict[str, Any],
) -> None:
    # Given a DAG whose first try's connection (the Postgres provider's, psycopg 3) is terminated by
    # an administrator's session during chunk 3, and which has one retry
    from devtools.postgres import dsn

    run = run_dag("se_lost_connection", conf={"admin_dsn": dsn(pg_params)})
    # Then the first try fails as retryable, naming the lost connection, and the retry resumes from
    # the checkpoint after chunk 2 and finishes with every item once
    ti = run.get_task_instance("work")
    assert str(run.state) == "success" and ti.try_number == 2
    job = "se_lost_connection.work"
    with checkpoints.open() as s:
        slot = s.execute("SELECT slot FROM resumable_checkpoints WHERE job = %s", (job,)).fetchone()[0]
        s.commit()
        first, second = s.listings.history(job, slot)
        items = s.execute("SELECT item FROM sink ORDER BY item").fetchall()
        s.commit()
    assert first.outcome == "failed" and "StoreUnavailable: lost the connection" in first.error
    assert (first.processed_end, second.processed_start, second.outcome) == (10, 10, "done")
    assert [r[0] for r in items] == list(range(ITEMS))
