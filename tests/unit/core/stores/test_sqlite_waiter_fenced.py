"""A live but slow SQLite holder: a partition waiting for the write lock behind
another process's long transaction, its lease lapsed (its keeper cannot write either). A person's
Release is accepted against it as soon as the lock is let go (the rules judge the lease alone). The
waiter's next write must then be fenced: its chunk's rows rolled back with the refused checkpoint,
nothing lost and nothing written twice once the next try finishes the slot. Real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import SQLiteStore
from airflow_resumable.core.control import requests as core_control
from airflow_resumable.core.model.errors import RequestRefused
from support.paths import TESTS
from support.stores import spec_of
from support.waits import wait_until

ITEMS = 80
WORKER = TESTS / "support" / "sqlite_load_worker.py"

#: Another process's long write transaction: it takes the turnstile as the store's writers do (so it
#: gets the lock between two of the waiter's chunks), holds the lock for ``hold`` seconds, lets go.
_LONG = """
import fcntl, os, sqlite3, sys, time
path, hold = sys.argv[1], float(sys.argv[2])
fd = os.open(os.path.realpath(path) + "-turns", os.O_RDWR | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
conn = sqlite3.connect(path, timeout=60, isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
fcntl.flock(fd, fcntl.LOCK_UN)
print("locked", flush=True)
time.sleep(hold)
conn.execute("COMMIT")
print("let go", flush=True)
"""


def _worker(spec: str, attempt: int, lease: float, hold: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(WORKER), spec, "w44", "s", str(ITEMS), "1", str(hold), str(attempt),
                             str(lease)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _stopped(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=120)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return next(e for e in reversed(lines) if e["event"] == "stopped")


@pytest.mark.parametrize("force", [False, True])
def test_a_release_accepted_against_a_live_waiter_whose_lease_lapsed_fences_its_next_write(tmp_path: Path,
                                                                                          force: bool) -> None:
    path = tmp_path / "checkpoints.db"
    store = SQLiteStore(path)
    with store.open() as s:
        s.ensure_schema()
        s.execute("CREATE TABLE sink (slot TEXT NOT NULL, item INTEGER NOT NULL)")
        s.commit()
    spec = spec_of(store)

    def row() -> Any:
        with store.open() as s:
            return s.checkpoints.load("w44", "s")

    # Given a partition with a 1 s lease writing its chunks through ctx.transaction()
    waiter = _worker(spec, 1, 1.0, 0.05)
    long = None
    try:
        wait_until(lambda: (r := row()) is not None and r.processed >= 5, "the waiter's first checkpoints")
        # When another process holds the write lock for 6 s: the waiter's lease lapses while it waits
        long = subprocess.Popen([sys.executable, "-c", _LONG, str(path), "6"], stdout=subprocess.PIPE, text=True)
        assert long.stdout is not None and long.stdout.readline().strip() == "locked"
        wait_until(lambda: row().lease_expires_at < datetime.now(tz=timezone.utc), "the waiter's lease lapsing",
                   timeout=20)
        assert waiter.poll() is None  # alive, waiting
        # and bob releases the slot (the write waits for the lock, then races the waiter for it)
        released: list[Any] = []

        def release() -> None:
            try:
                released.append(core_control.release(store, "w44", "s", by="bob", force=force))
            except RequestRefused as exc:
                released.append(exc)

        asker = threading.Thread(target=release, daemon=True)
        asker.start()
        asker.join(60)
        first = _stopped(waiter)
    finally:
        for proc in (long, waiter):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(30)
    # Then (whichever took the lock first) the next try finishes the slot, and every item is in the sink once
    if first["status"] != "done":
        second = _worker(spec, 2, 5.0, 0.0)
        assert _stopped(second)["status"] == "done"
    with store.open() as s:
        items = [r[0] for r in s.execute("SELECT item FROM sink ORDER BY item").fetchall()]
        final = s.checkpoints.load("w44", "s")
    assert final.status == "done" and final.processed == ITEMS, final
    if force:  # the forced release was taken, and the waiter's next write fenced (it stopped, lease lost)
        assert not isinstance(released[0], RequestRefused) and first["status"] is None, (released, first)
        assert "LeaseLost" in first["error"] and "bob" in first["error"], first
    assert items == list(range(ITEMS)), (released, first, [i for i in set(items) if items.count(i) > 1],
                                         sorted(set(range(ITEMS)) - set(items)))
