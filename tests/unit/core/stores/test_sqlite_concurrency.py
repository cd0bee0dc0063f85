"""The embedded SQLite store under the load it says it takes: the workers of one host (issue 19).

Real processes on one SQLite file, default settings (lease 30 s, busy timeout 30 s), many short
chunks that write through ``ctx.transaction()`` and so hold the write lock until their checkpoint.
SQLite has one writer and no queue: without turns at the lock, a run that commits and takes the
lock again at once starves its own lease keeper, control requests and the other worker.

Every renewal of a lease is logged by a trigger in the database itself, so the gaps between
renewals are the database's own timestamps, not an observer's.
"""

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

from airflow_resumable.core.control import requests as control
from airflow_resumable.core.model.defaults import LEASE
from airflow_resumable.core.model.errors import RequestRefused
from airflow_resumable.core.stores import SQLiteStore
from support.paths import SUPPORT
from support.stores import spec_of
from support.waits import wait_until

WORKER = SUPPORT / "sqlite_load_worker.py"


def _prepare(store: SQLiteStore) -> None:
    """The sink, and a log of every lease renewal (a change of ``heartbeat_at``) per slot."""
    with store.open() as s:
        s.ensure_schema()
        s.execute("CREATE TABLE sink (slot TEXT NOT NULL, item INTEGER NOT NULL)")
        s.execute("CREATE TABLE renewals (slot TEXT NOT NULL, at REAL NOT NULL)")
        s.execute(
            "CREATE TRIGGER log_renewal AFTER UPDATE OF heartbeat_at ON resumable_checkpoints "
            "WHEN NEW.heartbeat_at IS NOT OLD.heartbeat_at "
            "BEGIN INSERT INTO renewals VALUES (NEW.slot, NEW.heartbeat_at); END"
        )
        s.commit()


def _start(store: SQLiteStore, job: str, slot: str, items: int, chunk: int, hold: float, attempt: int = 1,
           lease: float | None = None) -> subprocess.Popen[str]:
    args = [sys.executable, str(WORKER), spec_of(store), job, slot, str(items), str(chunk), str(hold), str(attempt)]
    if lease is not None:
        args.append(str(lease))
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stopped(proc: subprocess.Popen[str], timeout: float) -> dict:
    out, err = proc.communicate(timeout=timeout)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines and lines[-1]["event"] == "stopped", f"the worker did not report how it stopped:\n{err[-3000:]}"
    return lines[-1]


def _longest_gap(store: SQLiteStore, job: str, slot: str) -> tuple[float, int]:
    """The longest time the slot's lease went unrenewed while its run held it (from taking the
    lease, through each renewal, to the final status), and how many renewals there were."""
    with store.open() as s:
        row = s.checkpoints.load(job, slot)
        at = [r[0] for r in s.execute("SELECT at FROM renewals WHERE slot = %s ORDER BY at", (slot,)).fetchall()]
        s.commit()
    assert row is not None and row.lease_acquired_at is not None and row.updated_at is not None
    times = [row.lease_acquired_at.timestamp(), *at, row.updated_at.timestamp()]
    return max(b - a for a, b in zip(times, times[1:], strict=False)), len(at)


def _sink(store: SQLiteStore) -> dict[str, tuple[int, int]]:
    with store.open() as s:
        rows = s.execute("SELECT slot, count(*), count(DISTINCT item) FROM sink GROUP BY slot").fetchall()
        s.commit()
    return {slot: (int(n), int(distinct)) for slot, n, distinct in rows}


def _processed(store: SQLiteStore, job: str, slot: str) -> int:
    with store.open() as s:
        row = s.checkpoints.load(job, slot)
    return row.processed if row else 0


def _status(store: SQLiteStore, job: str, slot: str) -> str | None:
    with store.open() as s:
        row = s.checkpoints.load(job, slot)
    return row.status if row else None


@pytest.fixture
def sqlite_store(tmp_path: Path) -> SQLiteStore:
    store = SQLiteStore(tmp_path / "checkpoints.db")
    _prepare(store)
    return store


def test_two_workers_on_one_file_both_finish_with_every_item_once_and_their_leases_renewed(
    sqlite_store: SQLiteStore,
) -> None:
    # Given two processes on one SQLite file, default settings, each running 500 transactional
    # chunks that hold the write lock for 20 ms (about 25 s in all: the two take turns)
    items, chunk, hold = 5000, 10, 0.02
    procs = {slot: _start(sqlite_store, f"load.{slot}", slot, items, chunk, hold) for slot in ("a", "b")}
    # When both run to the end, while a third writer (a release request, refused: the holder is
    # alive) asks every 0.2 s
    wait_until(lambda: _processed(sqlite_store, "load.a", "a") >= chunk, "worker a's first checkpoint")
    slowest, asked = 0.0, 0
    while all(proc.poll() is None for proc in procs.values()) and asked < 50:
        began = time.monotonic()
        with pytest.raises(RequestRefused):
            control.release(sqlite_store, "load.a", "a", by="test")
        slowest, asked = max(slowest, time.monotonic() - began), asked + 1
        time.sleep(0.2)
    ends = {slot: _stopped(proc, timeout=55) for slot, proc in procs.items()}
    # Then both finished done, every item of each written exactly once
    for slot, end in ends.items():
        assert (end["status"], end["error"]) == ("done", None), f"worker {slot}: {end}"
        assert _status(sqlite_store, f"load.{slot}", slot) == "done"
    assert _sink(sqlite_store) == {"a": (items, items), "b": (items, items)}
    # And the third writer got its turn within a few chunks each time
    assert asked >= 10, "the workers ended before the third writer could prove anything"
    assert slowest < 1.0, f"a request waited {slowest:.2f}s for its turn at the write lock (chunks of {hold:g}s)"
    # And each lease was renewed on time: every lease / 3, the longest gap well under the lease
    for slot in ("a", "b"):
        gap, renewals = _longest_gap(sqlite_store, f"load.{slot}", slot)
        assert renewals >= 1, f"slot {slot}: the lease was never renewed while the run held it"
        assert gap < LEASE / 2, f"slot {slot}: the lease went {gap:.1f}s unrenewed (lease {LEASE:g}s)"


def test_a_pause_gets_through_while_a_transactional_run_holds_the_lock_and_the_resumed_run_finishes(
    sqlite_store: SQLiteStore,
) -> None:
    # Given a run in its own process, default settings, whose 100 ms chunks hold the write lock
    job, slot, items, chunk, hold = "load.pause", "p", 1500, 10, 0.1
    proc = _start(sqlite_store, job, slot, items, chunk, hold)
    wait_until(lambda: _processed(sqlite_store, job, slot) >= 5 * chunk, "the run's first checkpoints")
    # When a pause is requested from another process's connection
    began = time.monotonic()
    control.pause(sqlite_store, job, slot, by="test")
    took = time.monotonic() - began
    # Then it gets through within about a chunk, not a busy timeout
    assert took < 5.0, f"control.pause took {took:.1f}s while the run held the write lock"
    # And the run pauses at a chunk boundary, after its next heartbeat (lease / 3) has read the request
    end = _stopped(proc, timeout=LEASE)
    assert end["reason"] == "paused", end
    assert _status(sqlite_store, job, slot) == "paused"
    # When it is resumed and a new attempt runs
    control.resume(sqlite_store, job, slot, by="test")
    end = _stopped(_start(sqlite_store, job, slot, items, chunk, hold, attempt=2), timeout=40)
    # Then the slot is done with every item written exactly once
    assert (end["status"], end["error"]) == ("done", None), end
    assert _sink(sqlite_store) == {slot: (items, items)}


def test_a_live_transactional_runs_lease_keeps_a_non_forced_release_refused(sqlite_store: SQLiteStore) -> None:
    # Given a run with a 3 s lease (renewed every second) whose 20 ms chunks hold the write lock
    job, slot, items, chunk, hold, lease = "load.release", "r", 3000, 10, 0.02, 3.0
    proc = _start(sqlite_store, job, slot, items, chunk, hold, lease=lease)
    wait_until(lambda: _processed(sqlite_store, job, slot) >= chunk, "the run's first checkpoint")
    # When someone asks, again and again while it runs, to release the slot of a dead holder
    accepted, asked, slowest = [], 0, 0.0
    while proc.poll() is None and _processed(sqlite_store, job, slot) < items - 20 * chunk:
        asked += 1
        began = time.monotonic()
        try:
            control.release(sqlite_store, job, slot, by="test")
            accepted.append(time.monotonic())
        except RequestRefused:
            pass
        slowest = max(slowest, time.monotonic() - began)
        time.sleep(0.2)
    end = _stopped(proc, timeout=40)
    # Then every request was refused (the holder is alive: its lease is renewed on time) and the
    # run finished done, every item once
    assert slowest < lease / 3, f"a release waited {slowest:.1f}s for the write lock the run kept taking"
    assert asked >= 10, "the run ended before the releases could prove anything"
    assert accepted == [], f"{len(accepted)} of {asked} non-forced releases were accepted against a live holder"
    assert (end["status"], end["error"]) == ("done", None), end
    assert _sink(sqlite_store) == {slot: (items, items)}
    gap, _ = _longest_gap(sqlite_store, job, slot)
    assert gap < lease * 2 / 3, f"the lease went {gap:.2f}s unrenewed (lease {lease:g}s)"


def _history(store: SQLiteStore, job: str) -> list[tuple[int, str | None, str | None]]:
    """The slot's attempts as the history keeps them: ``(attempt, outcome, error)``."""
    with store.open() as s:
        rows = s.execute("SELECT attempt, outcome, error FROM resumable_attempts WHERE job = %s ORDER BY id",
                         (job,)).fetchall()
        s.commit()
    return [(int(a), o, e) for a, o, e in rows]


@pytest.fixture
def quick_store(tmp_path: Path) -> SQLiteStore:
    """A store whose writers give up after 1.5 s (the default 30 s, made test-sized)."""
    store = SQLiteStore(tmp_path / "checkpoints.db", busy_timeout=1.5)
    _prepare(store)
    return store


def test_partitions_side_by_side_wait_their_turn_behind_a_chunk_longer_than_the_busy_timeout_and_lease(
    quick_store: SQLiteStore,
) -> None:
    # Given one slot whose chunks hold the write lock 5 s each (a skip policy replaying a chunk item
    # by item inside its transaction), past the busy timeout (1.5 s) and its own lease (2 s)
    long = _start(quick_store, "side.long", "l", 4, 2, 5.0, lease=2.0)
    wait_until(lambda: _processed(quick_store, "side.long", "l") >= 2, "the long slot's first checkpoint")
    # When two slots checkpoint short chunks beside it, each with the same lease
    steady = {slot: _start(quick_store, f"side.{slot}", slot, 300, 10, 0.05, lease=2.0) for slot in ("a", "b")}
    ends = {slot: _stopped(proc, timeout=90) for slot, proc in {**steady, "l": long}.items()}
    # Then every slot finished done, every item written exactly once: the steady ones waited their
    # turn past the busy timeout while the long one held the lock, and the long one kept its lease
    # although its own transaction kept its renewals waiting
    for slot, end in ends.items():
        assert (end["status"], end["error"]) == ("done", None), f"slot {slot}: {end}"
    assert _sink(quick_store) == {"l": (4, 4), "a": (300, 300), "b": (300, 300)}
    for job in ("side.long", "side.a", "side.b"):
        assert [outcome for _, outcome, _ in _history(quick_store, job)] == ["done"], _history(quick_store, job)


def _stop_while_holding(store: SQLiteStore, proc: subprocess.Popen[str], job: str) -> None:
    """SIGSTOP ``proc`` at a moment it holds the write lock (checked in the lock table after the
    signal: a chunk's hold can end between seeing it and stopping the process, so try again)."""
    from airflow_resumable.core.stores.sqlite_errors import WAL_WRITE_LOCK, _holder, _lock_table, live_writer

    for _ in range(10):
        wait_until(lambda: job in (live_writer(store.path) or ""), f"{job} to hold the write lock")
        proc.send_signal(signal.SIGSTOP)
        table = _lock_table() or []
        held = _holder(f"{store.path}-shm", "the write lock", table, posix_byte=WAL_WRITE_LOCK)
        if held is not None and held.pid == proc.pid:
            return
        proc.send_signal(signal.SIGCONT)
    raise AssertionError(f"{job} was never stopped while holding the write lock")


def test_a_stopped_lock_holder_is_not_waited_for_past_the_busy_timeout_and_is_named(quick_store: SQLiteStore) -> None:
    # Given a slot frozen (SIGSTOP) inside a chunk's transaction, holding the write lock
    frozen = _start(quick_store, "stop.frozen", "f", 10, 2, 3.0)
    _stop_while_holding(quick_store, frozen, "stop.frozen")
    try:
        # When another slot writes beside it
        end = _stopped(_start(quick_store, "stop.other", "o", 20, 10, 0.0), timeout=60)
    finally:
        frozen.send_signal(signal.SIGCONT)
    # Then that writer gave up (a stopped holder commits nothing while stopped), naming the holder
    # as stopped, rather than waiting on it for good
    assert end["status"] is None and end["error"].startswith("StoreBusy"), end
    assert f"pid {frozen.pid}" in end["error"] and "stopped" in end["error"], end
    assert _stopped(frozen, timeout=60)["status"] == "done"


def test_a_patient_writer_gives_up_after_ten_busy_timeouts_naming_a_holder_that_never_lets_go(
    tmp_path: Path,
) -> None:
    # Given a slot whose one chunk holds the write lock for minutes (a deadlock with a lock of the
    # handler's own looks the same from outside: a live attempt that never commits)
    store = SQLiteStore(tmp_path / "checkpoints.db", busy_timeout=0.5)
    _prepare(store)
    long = _start(store, "cap.long", "l", 4, 2, 120.0)
    try:
        from airflow_resumable.core.stores.sqlite_errors import live_writer

        wait_until(lambda: "cap.long" in (live_writer(store.path) or ""), "the long slot to hold the write lock")
        # When another attempt writes beside it
        began = time.monotonic()
        end = _stopped(_start(store, "cap.other", "o", 20, 10, 0.0), timeout=60)
        took = time.monotonic() - began
    finally:
        long.kill()
        long.wait(30)
    # Then it waited on the live holder past its busy timeout, but not for good: ten busy timeouts,
    # then it failed naming the holder and the attempt it runs
    assert end["error"].startswith("StoreBusy") and "ten busy timeouts" in end["error"], end
    assert f"pid {long.pid}" in end["error"] and "cap.long" in end["error"], end
    assert 4.5 <= took < 30, took


def test_a_store_opened_through_a_symbolic_link_takes_turns_with_one_opened_by_the_file_s_own_path(
    tmp_path: Path,
) -> None:
    real = tmp_path / "data" / "checkpoints.db"
    real.parent.mkdir()
    (tmp_path / "link").symlink_to(real.parent)
    through_link = SQLiteStore(tmp_path / "link" / "checkpoints.db").connect()
    direct = SQLiteStore(real).connect()
    try:
        # SQLite keeps -wal and -shm beside the file the link points to: so must the turnstile be
        assert through_link.turns.path == direct.turns.path == f"{real}-turns"
    finally:
        through_link.close()
        direct.close()


def test_a_handler_without_transactions_waits_its_turn_too_its_checkpoints_sent_again(quick_store: SQLiteStore) -> None:
    from airflow_resumable.core import Attempt
    from airflow_resumable.core.model.identity import Identity
    from airflow_resumable.core.stores.sqlite_errors import live_writer

    # Given a slot whose chunk holds the write lock 4 s (past the 1.5 s busy timeout)
    long = _start(quick_store, "plain.long", "l", 2, 2, 4.0)
    try:
        wait_until(lambda: "plain.long" in (live_writer(quick_store.path) or ""), "the long slot to hold the lock")

        # When an attempt that never opens a transaction checkpoints beside it (each checkpoint a
        # statement of its own, which waits in SQLite's busy handler and is sent again)
        def plain(ctx: Any) -> int:
            for i in range(1, 6):
                ctx.checkpoint(i, processed=i)
            return 5

        outcome = Attempt(quick_store, Identity(job="plain.other", slot="o", attempt=1, owner="o-1")).run(plain)
    finally:
        end = _stopped(long, timeout=60)
    # Then both finished done
    assert (outcome.checkpoint.status, outcome.checkpoint.position) == ("done", 5)
    assert (end["status"], end["error"]) == ("done", None), end


def test_a_checkpoint_renews_its_holder_s_lease_in_its_own_write(quick_store: SQLiteStore) -> None:
    from airflow_resumable.core.model.checkpoint import Write
    from airflow_resumable.core.model.fence import Fence

    with quick_store.open() as s:
        row = s.leases.acquire("renew", "s", "o", 1.0).row  # type: ignore[union-attr]
        s.execute(f"UPDATE resumable_checkpoints SET lease_expires_at = {s.d.now()} - 5 WHERE job = 'renew'")
        s.commit()
        s.checkpoints.save(Fence.of(row), Write(position="1", state="{}", processed=1, total=None), 30.0)
        s.commit()
        assert s.checkpoints.load("renew", "s").lease_expires_at > row.lease_expires_at  # type: ignore[union-attr]


_CHURN = """
import sys
from airflow_resumable.core.stores import SQLiteStore
store = SQLiteStore(sys.argv[1])
for _ in range(int(sys.argv[2])):
    conn = store.connect(autocommit=True)
    conn.execute("INSERT INTO sink VALUES ('churn', 1)")
    conn.close()  # the file's last connection: SQLite deletes -wal and -shm
"""


def test_a_store_opened_while_another_process_closes_the_file_is_not_taken_for_read_only(
    sqlite_store: SQLiteStore,
) -> None:
    from airflow_resumable.core.stores.sqlite_errors import unwritable

    # Given another process opening and closing the file's last connection, over and over, so that
    # SQLite deletes and makes again its -wal and -shm files
    churn = subprocess.Popen([sys.executable, "-c", _CHURN, str(sqlite_store.path), "1500"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # When this process checks, as every connect() does first, that it may write the file and the
    # files beside it, all the while
    refused: list[str] = []
    checks, wal_seen, wal_gone = 0, 0, 0
    deadline = time.monotonic() + 120
    while churn.poll() is None and time.monotonic() < deadline:
        found = unwritable(sqlite_store.location)
        if found is not None:
            refused.append(str(found))
        checks += 1
        if os.path.exists(f"{sqlite_store.path}-wal"):
            wal_seen += 1
        else:
            wal_gone += 1
    out, err = churn.communicate(timeout=60)
    assert churn.returncode == 0, err[-2000:]
    # Then none of those checks calls a file the other process just deleted read-only
    assert wal_seen and wal_gone, (checks, wal_seen, wal_gone)  # the race was there to be lost
    assert not refused, f"{len(refused)} of {checks} checks refused the store: {refused[0]}"
