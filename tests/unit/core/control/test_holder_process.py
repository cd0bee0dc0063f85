"""The process behind a running slot, where this host can see it (core/model/process.py): a holder
killed with SIGKILL is shown abandoned at once, not when its lease lapses; a frozen one (SIGSTOP)
stalled while it still holds its lease; and on SQLite one whose lease lapsed while it waited for the
write lock behind another partition's long chunk is shown stalled, not abandoned: it is alive, and
it goes on once the lock is let go. Each read as ``airflow resumable show`` prints it, on real rows
of real holder processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import SQLiteStore
from support.module_cli import run_module_cli
from support.paths import TESTS
from support.stores import empty_store, spec_of

#: A holder as an Airflow task's attempt is (owner ``<ti>/try<N>@<host>:<pid>``): it checkpoints once,
#: prints ``holding``, then works inside a chunk, through ctx.transaction() if asked to, for minutes.
_HOLDER = """
import os, socket, sys, time
sys.path.insert(0, sys.argv[4])
from airflow_resumable.core import Attempt, Options
from airflow_resumable.core.model.identity import Identity
from support.stores import store_of

job, lease, hold = sys.argv[2], float(sys.argv[3]), sys.argv[5]

def work(ctx):
    ctx.total = 1000
    ctx.checkpoint(10, processed=10)
    print("holding", flush=True)
    if hold == "hold":
        ctx.transaction().execute("CREATE TABLE IF NOT EXISTS held (n INTEGER)")
        print("locked", flush=True)
    if hold == "block":  # a row another partition's transaction holds: this chunk waits for it
        print("blocking", flush=True)
        ctx.transaction().execute("UPDATE shared SET n = n + 1 WHERE id = 1")
        ctx.checkpoint(20, processed=20)
        return
    time.sleep(600)

owner = f"ti-1/try1@{socket.gethostname()}:{os.getpid()}"
Attempt(store_of(sys.argv[1]), Identity(job=job, slot="s", attempt=1, owner=owner), options=Options(lease=lease)).run(work)
"""


def _holder(spec: str, job: str, *, lease: float, hold: bool | str = False) -> subprocess.Popen[str]:
    mode = hold if isinstance(hold, str) else "hold" if hold else "-"
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, spec, job, str(lease), str(TESTS), mode],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    return proc


def _show(capsys: pytest.CaptureFixture[str], job: str) -> dict[str, Any]:
    assert run_module_cli(["show", job, "s", "--output", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _until(capsys: pytest.CaptureFixture[str], job: str, shown: str, timeout: float = 30,
           lease: str | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    view = _show(capsys, job)
    while (view["shown_status"] != shown or lease not in (None, view["lease"])) and time.monotonic() < deadline:
        time.sleep(0.1)
        view = _show(capsys, job)
    return view


def test_a_holder_killed_with_sigkill_is_shown_dead_at_once_not_running_until_its_lease_lapses(
        store_kind: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    store, uri = empty_store(store_kind, tmp_path, request)
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", uri)
    # Given a holder with a 60 s lease, running
    holder = _holder(spec_of(store), "j.killed", lease=60.0)
    try:
        assert _show(capsys, "j.killed")["shown_status"] == "running"
        # When it is killed with SIGKILL (nothing written: the row still says running, its lease live)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
    finally:
        if holder.poll() is None:
            holder.kill()
    # Then show says at once that its process is gone and nobody runs it, though its lease (by which
    # the requests are judged) holds the slot for another minute: Release is offered now
    view = _show(capsys, "j.killed")
    assert (view["status"], view["lease"], view["shown_status"]) == ("running", "live", "stalled"), view
    assert f"(pid {holder.pid} on " in view["shown_why"] and "is gone" in view["shown_why"], view["shown_why"]
    assert "nobody runs this slot" in view["shown_why"] and "release --force" in view["shown_why"]
    assert view["rate"] is None and view["eta_seconds"] is None


def test_a_frozen_holder_is_shown_stalled_while_it_holds_its_lease_and_running_once_it_continues(
        store_kind: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    store, uri = empty_store(store_kind, tmp_path, request)
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", uri)
    holder = _holder(spec_of(store), "j.frozen", lease=60.0)
    try:
        os.kill(holder.pid, signal.SIGSTOP)
        view = _until(capsys, "j.frozen", "stalled")
        assert (view["lease"], view["shown_status"]) == ("live", "stalled"), view
        assert "is stopped" in view["shown_why"] and f"kill -CONT {holder.pid}" in view["shown_why"]
        os.kill(holder.pid, signal.SIGCONT)
        assert _until(capsys, "j.frozen", "running")["shown_status"] == "running"
    finally:
        holder.kill()
        holder.wait(30)


def test_on_sqlite_a_holder_whose_lease_lapsed_while_it_waits_for_the_write_lock_is_stalled_not_abandoned(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "checkpoints.db"
    store = SQLiteStore(path)
    with store.open() as s:
        s.ensure_schema()
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", f"sqlite:///{path}")
    # Given a partition with a 1 s lease, running (its lease renewed every third of a second)
    waiter = _holder(spec_of(store), "j.waiting", lease=1.0)
    long = None
    try:
        assert _show(capsys, "j.waiting")["shown_status"] == "running"
        # When another partition's chunk holds the write lock (its transaction open for minutes), so
        # that the first one's renewals wait behind it and its lease lapses
        long = _holder(spec_of(store), "j.long", lease=60.0, hold=True)
        assert long.stdout is not None and long.stdout.readline().strip() == "locked"
        view = _until(capsys, "j.waiting", "stalled", lease="expired")
        # Then it is shown stalled, its lease lapsed but its process running: not abandoned
        assert (view["lease"], view["shown_status"]) == ("expired", "stalled"), view
        assert "still runs" in view["shown_why"] and "write lock" in view["shown_why"], view["shown_why"]
    finally:
        for proc in (long, waiter):
            if proc is not None:
                proc.kill()
                proc.wait(30)
    # And once its process is gone, abandoned
    assert _show(capsys, "j.waiting")["shown_status"] == "abandoned"


@pytest.mark.parametrize("pid", ["\u00b2", "\u0661\u0662", "0", "1", "-5", "99999999999999999999", "abc", ""])
def test_an_owner_naming_no_process_of_a_task_leaves_the_slot_to_its_lease(pid: str) -> None:
    """A lease owner written by a hand or a program, ``x@<this host>:<pid>``: a digit Python's int()
    refuses, one of another script, pid 0 or 1 (a container's init), a huge or negative one."""
    import socket
    from datetime import datetime, timezone

    from airflow_resumable.core.model.process import holder_process

    assert holder_process(f"x@{socket.gethostname()}:{pid}", datetime.now(tz=timezone.utc)) is None


def test_a_lease_lapsed_long_ago_is_abandoned_whatever_runs_under_its_pid_now() -> None:
    import socket
    from datetime import datetime, timedelta, timezone

    from airflow_resumable.core.model.checkpoint import Checkpoint
    from airflow_resumable.core.view import liveness_of

    now = datetime.now(tz=timezone.utc)
    # The owner names a process that runs and started before the lease (this test's parent, say)
    owner = f"ti-9/try1@{socket.gethostname()}:{os.getppid()}"
    row = Checkpoint(job="j", slot="s", status="running", lease_owner=owner, lease_token=1, attempt=1,
                     lease_acquired_at=now - timedelta(seconds=30), heartbeat_at=now - timedelta(seconds=20),
                     lease_expires_at=now - timedelta(seconds=10), updated_at=now - timedelta(seconds=20))
    assert liveness_of(row, now).shown == "stalled"  # lapsed 10 s ago, its process runs: it may be waiting
    assert liveness_of(row, now + timedelta(minutes=5)).shown == "abandoned"  # lapsed long ago: not its holder


def test_on_postgresql_a_holder_blocked_on_another_partition_s_long_transaction_keeps_its_lease_and_finishes(
        pg_params: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL's analogue of SQLite's one writer: a chunk that waits for a row another partition's
    open transaction holds. Its lease is renewed on a connection of its own meanwhile, so it is shown
    running with a live lease for as long as it waits, never stalled past its lease nor taken over,
    and it finishes once the row is let go."""
    import psycopg2

    from airflow_resumable.core import PostgresStore
    from devtools.postgres import dsn

    store = PostgresStore(**pg_params)
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        s.execute("CREATE TABLE shared (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
        s.execute("INSERT INTO shared VALUES (1, 0)")
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", dsn(pg_params))
    # Given another partition's transaction holding the row for as long as the test says
    other = psycopg2.connect(**pg_params)
    holder = None
    try:
        other.cursor().execute("UPDATE shared SET n = n + 100 WHERE id = 1")
        # When a holder with a 3 s lease waits for that row inside its chunk through three renewals
        holder = _holder(spec_of(store), "j.blocked", lease=3.0, hold="block")
        assert holder.stdout is not None and holder.stdout.readline().strip() == "blocking"
        started = _show(capsys, "j.blocked")["heartbeat_at"]
        deadline = time.monotonic() + 60
        renewed = 0
        while renewed < 3 and time.monotonic() < deadline:  # three renewals seen while it waits
            time.sleep(0.2)
            view = _show(capsys, "j.blocked")
            if view["heartbeat_at"] != started:
                renewed, started = renewed + 1, view["heartbeat_at"]
            # Then at every look it is shown running with a live lease
            assert (view["shown_status"], view["lease"]) == ("running", "live"), view
        assert renewed >= 3 and holder.poll() is None, "the holder waited, renewing its lease"
        other.commit()
        # And once the row is let go it finishes, its one attempt done: no lease lost, nothing twice
        assert holder.wait(30) == 0
    finally:
        other.close()
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait(30)
    with store.open() as s:
        row = s.checkpoints.load("j.blocked", "s")
        history = s.listings.history("j.blocked", "s")
        n = s.execute("SELECT n FROM shared WHERE id = 1").fetchone()[0]
    assert row is not None and (row.status, row.processed) == ("done", 20)
    assert [r.outcome for r in history] == ["done"] and n == 101
