"""SQLite's turns at the write lock: odd busy timeouts given to the core's store directly (the
Airflow connection's extra is range-checked; ``SQLiteStore(busy_timeout=...)`` is the core's API). A
busy timeout SQLite cannot hold (more than 2**31 - 1 ms: 24.8 days) turned into no wait at all: the
write gave up at once, saying the lock "stayed taken for 3e+06s"."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from airflow_resumable.core import Attempt, ConfigurationError, SQLiteStore
from airflow_resumable.core.model.errors import StoreBusy
from airflow_resumable.core.model.identity import Identity


@pytest.mark.parametrize("busy", [3e6, 1e12, 2**63])
def test_a_huge_busy_timeout_is_refused_up_front_or_waited_never_a_write_that_gives_up_at_once(
        tmp_path: Path, busy: float) -> None:
    path = tmp_path / "checkpoints.db"
    try:
        store = SQLiteStore(path, busy_timeout=busy)
    except ConfigurationError as exc:
        assert "busy_timeout" in str(exc) and "86400" in str(exc), exc
        return
    with store.open() as s:
        s.ensure_schema()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the write lock for a second
    threading.Timer(1.0, lambda: other.execute("COMMIT")).start()
    began = time.monotonic()
    out = Attempt(store, Identity(job="j", slot="s", attempt=1, owner="w")).run(
        lambda ctx: ctx.checkpoint(1, processed=1))
    assert out.checkpoint.status == "done" and time.monotonic() - began >= 0.9


def test_a_busy_timeout_below_a_millisecond_is_refused_as_the_connection_s_extra_is(tmp_path: Path) -> None:
    """1e-9 s is PRAGMA busy_timeout = 0: no wait at all, while the error says it waited 1e-09 s."""
    with pytest.raises(ConfigurationError, match="busy_timeout"):
        SQLiteStore(tmp_path / "checkpoints.db", busy_timeout=1e-9)


def test_an_attempt_s_write_waits_behind_the_turn_another_thread_of_its_process_holds(tmp_path: Path) -> None:
    """Partitions side by side in one process's view: the lease keeper's renewal (another connection
    of the attempt's own process) holds the turn at the write lock while it waits for the lock. The
    attempt's checkpoint, waiting for that turn, used to give up at its busy timeout, naming "this very
    process" as if a connection of the handler's own held a transaction open."""
    import fcntl
    import os

    from airflow_resumable.core.stores.sqlite_errors import OWN_TURN, live_writer

    path = tmp_path / "checkpoints.db"
    store = SQLiteStore(path, busy_timeout=0.2)
    with store.open() as s:
        s.ensure_schema()
    # Given a connection of this process holding the turn (the keeper's, as WriteTurns.turn takes it)
    # while nobody holds the write lock
    turn = os.open(f"{os.path.realpath(path)}-turns", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(turn, fcntl.LOCK_EX)
        assert live_writer(os.path.realpath(path)) == OWN_TURN
        # When an attempt checkpoints meanwhile, the turn let go after five busy timeouts
        threading.Timer(1.0, lambda: fcntl.flock(turn, fcntl.LOCK_UN)).start()
        out = Attempt(store, Identity(job="j", slot="s", attempt=1, owner="w")).run(
            lambda ctx: ctx.checkpoint(1, processed=1))
    finally:
        os.close(turn)
    # Then it waited its turn and finished, rather than failing with StoreBusy at 0.2 s
    assert out.checkpoint.status == "done"


def test_a_write_lock_held_by_another_connection_of_this_process_still_ends_the_wait(tmp_path: Path) -> None:
    """The deadlock the rule is for: the handler's own connection holds a transaction open, so
    waiting on would never end; the write fails at the busy timeout naming this process."""
    from airflow_resumable.core.stores.sqlite_errors import live_writer

    path = tmp_path / "checkpoints.db"
    store = SQLiteStore(path, busy_timeout=0.2)
    with store.open() as s:
        s.ensure_schema()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        import os

        assert live_writer(os.path.realpath(path)) is None
        with pytest.raises(StoreBusy, match="this very process"):
            Attempt(store, Identity(job="j", slot="s", attempt=1, owner="w")).run(
                lambda ctx: ctx.checkpoint(1, processed=1))
    finally:
        other.close()
