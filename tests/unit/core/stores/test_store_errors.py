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
import time
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from airflow_resumable.core import Attempt
from airflow_resumable.core.model.errors import ConfigurationError, StoreUnavailable
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from support.paths import SUPPORT

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
            Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(_writer(terminate, kill_in_chunk=2))
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
    out = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="a2")).run(_writer(terminate))
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
        out = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(handler)
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
            Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(
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
    out = Attempt(
        store, Identity(job=JOB, slot=SLOT, attempt=2, owner="a2"),
    ).run(_writer(terminate, write_after_last=True))
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


# -- SQLite: a read-only file or folder -----------------------------------------------------------

def _read_only(target: Path) -> Any:
    """Make ``target`` (a file or a folder) read-only for this process, as it is for a worker's user
    without write permission; returns the undo. Root writes whatever the mode bits say, so as root
    the file system's immutable flag does it (``chattr +i``, which binds root too)."""
    if os.geteuid() != 0:
        mode = target.stat().st_mode
        target.chmod(0o555 if target.is_dir() else 0o444)
        return lambda: target.chmod(mode)
    subprocess.run(["chattr", "+i", str(target)], check=True)
    return lambda: subprocess.run(["chattr", "-i", str(target)], check=True)


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_read_only_sqlite_file_or_folder_is_a_store_error_naming_the_path_and_the_fix(
    what: str, tmp_path: Path
) -> None:
    # Given a checkpoint database made by its owner, then made read-only: the file (its folder
    # still writable, so SQLite could add its -wal file) or its folder
    folder = tmp_path / "db"
    path = folder / "checkpoints.db"
    with SQLiteStore(path).open() as s:
        s.ensure_schema()
    undo = _read_only(path if what == "file" else folder)
    try:
        # When a worker runs an attempt on it
        with pytest.raises(StoreUnavailable) as caught:
            Attempt(SQLiteStore(path), Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(
                lambda ctx: ctx.checkpoint(1, processed=1))
    finally:
        undo()
    # Then it fails with the store's error (retryable), naming the path, that it is read-only for
    # this user, and the fix; not SQLite's bare "attempt to write a readonly database"
    text = str(caught.value)
    if what == "file":
        assert f"the SQLite checkpoint file '{path}' is read-only for this process (user " in text, text
    else:
        assert f"the folder '{folder}' of the SQLite checkpoint file '{path}' is not writable" in text, text
        assert "-wal and -shm beside the file" in text
    assert "write access" in text and "sqlite:////" in text and f"job='{JOB}'" in text, text
    assert "attempt to write a readonly database" not in text


def test_a_write_sqlite_refuses_as_read_only_mid_run_is_the_store_error_naming_the_file(tmp_path: Path) -> None:
    # Given a store connection that SQLite itself refuses writes on (query_only: its SQLITE_READONLY,
    # as a file system remounted read-only under a running attempt would give)
    path = tmp_path / "checkpoints.db"
    store = SQLiteStore(path)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        s.conn.execute("PRAGMA query_only = 1")
        # When the store writes on it, in autocommit and in a transaction, then SQLite's bare "attempt
        # to write a readonly database" is the store's error, naming the file and what to do
        for transactions in (False, True):
            if transactions:
                s.begin_transactions()
            with pytest.raises(StoreUnavailable) as caught:
                s.execute("DELETE FROM resumable_checkpoints WHERE job = %s", (JOB,))
            text = str(caught.value)
            assert f"the SQLite checkpoint file '{path}' cannot be written (SQLITE_READONLY" in text, text
            assert "writable" in text and "attempt to write a readonly database" in text
            s.rollback()


# -- SQLite: file: URIs ---------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["file:{path}?mode=rwc", "file://{path}", "file://localhost{path}", "file:{path}"])
def test_a_sqlite_file_uri_names_the_checkpoint_file(tmp_path: Path, form: str) -> None:
    # Given a SQLite file: URI for the checkpoint file (a space in its path percent-encoded)
    path = tmp_path / "my checkpoints.db"
    store = SQLiteStore(form.format(path=str(path).replace(" ", "%20")))
    # When an attempt runs on it, then the checkpoints are in that file
    Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(lambda ctx: ctx.checkpoint(7, processed=7))
    assert store.path == str(path) and path.exists()
    assert _row(SQLiteStore(path)).position == 7


def test_a_sqlite_file_uri_in_an_airflow_connection_works_and_its_mode_is_honoured(airflow_home: Path,
                                                                                   tmp_path: Path) -> None:
    from airflow.models.connection import Connection

    from airflow_resumable.hooks.resumable import store_from_connection

    # Given connections naming the file as a SQLite URI (its ?mode= lands in the connection's extras)
    path = tmp_path / "checkpoints.db"
    rwc = store_from_connection(Connection(conn_id="resumable_default", uri=f"sqlite:///file:{path}?mode=rwc"))
    Attempt(rwc, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(lambda ctx: ctx.checkpoint(3, processed=3))
    assert rwc.path == str(path) and _row(rwc).position == 3
    # and mode=rw, which does not create a missing file: a store error saying so
    missing = store_from_connection(Connection(conn_id="resumable_default",
                                               uri=f"sqlite:///file:{tmp_path / 'nope.db'}?mode=rw"))
    with pytest.raises(StoreUnavailable, match="does not exist, and mode=rw does not create it"):
        Attempt(missing, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(lambda ctx: None)
    assert not (tmp_path / "nope.db").exists()


@pytest.mark.parametrize(("uri", "expected"), [
    ("file:relative.db", "is a relative path"),
    ("file:/abs/x.db?mode=ro", "mode=ro, which the store cannot honour: a read-only database cannot hold checkpoints"),
    ("file:/abs/x.db?mode=memory", "mode=memory, which the store cannot honour: an in-memory database"),
    ("file:/abs/x.db?immutable=1", "immutable=1, which the store cannot honour"),
    ("file:/abs/x.db?vfs=unix-none", "vfs=unix-none, which the store cannot honour"),
    ("file:/abs/x.db?cache=shared", "cache=shared, which the store cannot honour"),
    ("file://otherhost/abs/x.db", "names the host 'otherhost'"),
])
def test_a_sqlite_file_uri_the_store_cannot_honour_is_refused_saying_exactly_why(uri: str, expected: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        SQLiteStore(uri)
    text = str(caught.value)
    assert expected in text, text
    assert "'/file:" not in text  # not the old "relative path" hint that glued a slash in front of the URI
    if "relative" in expected:
        assert "'/relative.db' or file:/relative.db" in text, text


# -- SQLite: a writer waiting for the write lock ---------------------------------------------------


def _frozen_holder(path: Path, job: str, slot: str) -> subprocess.Popen[str]:
    """A real attempt of ``job``/``slot`` in another process, frozen (SIGSTOP) holding the write lock."""
    worker = SUPPORT / "frozen_writer.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, str(worker), str(path), job, slot], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # printed with the lock held, right before the process stops itself
    assert line.strip() == "holding", proc.stderr.read() if proc.poll() is not None else line
    deadline = time.monotonic() + 30
    while _state(proc.pid) != "T":
        assert time.monotonic() < deadline, "the writer did not stop itself"
        time.sleep(0.01)
    return proc


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def test_a_writer_waiting_past_the_busy_timeout_names_the_frozen_holder_and_how_to_find_it(tmp_path: Path) -> None:
    # Given an attempt of another slot, in another process, frozen (SIGSTOP) while its chunk's
    # transaction holds the file's write lock
    path = tmp_path / "checkpoints.db"
    holder = _frozen_holder(path, "nightly.load", "2026-03-01")
    try:
        # When an attempt on the same file waits for the lock past its busy timeout
        store = SQLiteStore(path, busy_timeout=1.0)
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            Attempt(
                store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1"),
            ).run(lambda ctx: ctx.checkpoint(1, processed=1))
        waited = time.monotonic() - began
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    # Then the error names the holder: its pid and host, that it is stopped, the attempt it runs
    # (job, slot, try, DAG, task, run), how to find it and how to let it go on; and this attempt's
    # own job and slot. After its own busy timeout, not SQLite's 30 s.
    text = str(caught.value)
    assert text.startswith("database is locked: the write lock of"), text
    assert f"held (the write lock) by pid {holder.pid} on {socket.gethostname()}" in text, text
    assert "stopped: SIGSTOP" in text and f"kill -CONT {holder.pid}" in text, text
    assert "attempt 3 of job='nightly.load' slot='2026-03-01'" in text, text
    assert "(DAG nightly, task load, run scheduled__2026-03-01)" in text, text
    assert f"ps -o pid,stat,etime,args -p {holder.pid}" in text and f"job='{JOB}'" in text, text
    assert waited < 20


def test_a_writer_of_this_very_process_holding_the_lock_is_named_as_such(tmp_path: Path) -> None:
    import sqlite3

    # Given a connection of this process (the handler's own, on the checkpoint file) holding the lock
    path = tmp_path / "checkpoints.db"
    store = SQLiteStore(path, busy_timeout=0.3)
    with store.open() as s:
        s.ensure_schema()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreUnavailable, match="held .the write lock. by this very process"):
            Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(lambda ctx: None)
    finally:
        other.rollback()
        other.close()


def test_a_writer_stuck_in_its_turn_at_the_lock_is_named_by_the_turnstiles_lock(tmp_path: Path) -> None:
    # Given another process holding the store's turnstile (a writer frozen while it waited for the
    # write lock: it holds the -turns file's flock, not SQLite's lock)
    path = tmp_path / "checkpoints.db"
    store = SQLiteStore(path, busy_timeout=0.5)
    with store.open() as s:
        s.ensure_schema()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('holding', flush=True)\ntime.sleep(120)", f"{path}-turns"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        # When a writer waits for its turn past the busy timeout
        with pytest.raises(StoreUnavailable) as caught:
            Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a1")).run(lambda ctx: None)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    # Then the error says it waited for its turn and names the process that has it
    text = str(caught.value)
    assert text.startswith(f"database is locked: another writer of '{path}' kept its turn"), text
    assert f"held (the turn at the write lock) by pid {holder.pid} on {socket.gethostname()}" in text, text
    assert "which runs no attempt this store knows of" in text
