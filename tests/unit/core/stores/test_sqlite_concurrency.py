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
import subprocess
import sys
import time
from pathlib import Path

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
