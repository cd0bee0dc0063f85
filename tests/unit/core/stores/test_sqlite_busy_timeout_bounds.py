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
