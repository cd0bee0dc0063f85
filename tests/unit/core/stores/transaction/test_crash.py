"""Guarantee 3: writes through ctx.transaction() commit with their checkpoint, exactly once.

A subprocess is killed with SIGKILL at random points (after a random number of chunks, somewhere
inside the next one), then resumed by a new process; at the end every item is in the sink exactly
once, whatever the store.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from airflow_resumable.core.stores import Store
from support.paths import SUPPORT
from support.stores import spec_of

WORKER = SUPPORT / "kill_worker.py"
ITEMS, CHUNK, TRIALS = 400, 9, 12
LEASE = 0.6  # a killed holder's lease lapses quickly, so the next attempt takes over


def _processed(store: Store) -> int:
    with store.open() as s:
        row = s.checkpoints.load("crash", "slot-1")
    return row.processed if row else 0


@pytest.mark.trials
def test_sigkill_at_random_points_leaves_every_item_written_exactly_once(store: Store) -> None:
    rng = random.Random(1729)
    with store.open() as s:
        s.ensure_schema()
        s._execute("CREATE TABLE sink (item INTEGER NOT NULL, attempt INTEGER NOT NULL)")
        s.commit()
    spec = spec_of(store)
    kills = 0
    for attempt in range(1, TRIALS + 1):
        before = _processed(store)
        if before >= ITEMS:
            break
        target = min(ITEMS - CHUNK, before + rng.randint(0, 4) * CHUNK)
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), spec, "crash", "slot-1", str(ITEMS), str(CHUNK), str(attempt), str(LEASE)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while _processed(store) < target and proc.poll() is None:
            assert time.monotonic() < deadline, "the worker made no progress"
            time.sleep(0.005)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.communicate(timeout=60)
    with store.open() as s:
        finished = s.checkpoints.load("crash", "slot-1").status == "done"
    if not finished:  # (running a done slot again would start it over, on purpose)
        final = subprocess.run(
            [sys.executable, str(WORKER), spec, "crash", "slot-1", str(ITEMS), str(CHUNK), str(TRIALS + 1), str(LEASE)],
            capture_output=True, text=True, timeout=120,
        )
        assert final.returncode == 0, final.stderr[-2000:]
    assert kills >= TRIALS // 2, "too few kills landed mid-run to prove anything"
    with store.open() as s:
        cur = s.conn.cursor()
        cur.execute("SELECT item, count(*) FROM sink GROUP BY item HAVING count(*) <> 1")
        assert cur.fetchall() == [], "some item was written twice"
        cur.execute("SELECT count(DISTINCT item), count(*) FROM sink")
        assert cur.fetchone() == (ITEMS, ITEMS)
        row = s.checkpoints.load("crash", "slot-1")
    assert (row.status, row.processed, row.position) == ("done", ITEMS, ITEMS)
