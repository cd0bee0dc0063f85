"""A lease lost is named by its cause: a person's forced Release of a live
holder is no takeover. The holder's next write is fenced (nothing of its chunk kept, nothing twice),
and its error must not tell of another attempt that took the lease over: none did."""

from __future__ import annotations

import threading
from typing import Any

from airflow_resumable.core import Attempt, LeaseLost, Options, Store
from airflow_resumable.core.control import requests as core_control
from airflow_resumable.core.model.identity import Identity


def test_a_forced_release_of_a_live_holder_is_named_as_such_not_as_a_takeover(store: Store) -> None:
    go, started = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        started.set()
        go.wait(30)
        ctx.checkpoint(2, processed=2)

    def run() -> None:
        try:
            Attempt(store, Identity(job="j44", slot="s", attempt=1, owner="w1"), options=Options(lease=30)).run(handler)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(30)
    core_control.release(store, "j44", "s", by="bob", force=True)
    go.set()
    t.join(30)
    assert len(errors) == 1 and isinstance(errors[0], LeaseLost), errors
    text = str(errors[0])
    with store.open() as s:
        row = s.checkpoints.load("j44", "s")
    assert row.processed == 1  # fenced: the write after the release kept nothing
    assert "took it over" not in text and "taken over by another attempt" not in text, text
    assert "bob" in text and "lease_released" in text, text


def test_a_lease_taken_over_after_the_store_kept_its_holder_from_renewing_says_the_store_was_busy(
        tmp_path: Any) -> None:
    """SQLite: another writer held the write lock longer than the lease (its renewals gave up at the
    busy timeout, which does not count against the lease), and while it held it the lease went to
    another attempt. The holder's error names both: the takeover, and that the store kept it from
    renewing for that long."""
    import sqlite3

    from airflow_resumable.core import SQLiteStore
    from airflow_resumable.core.model.errors import Cancelled
    from support.waits import wait_until

    store = SQLiteStore(tmp_path / "checkpoints.db", busy_timeout=0.2)
    with store.open() as s:
        s.ensure_schema()
    started, stopped = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        started.set()
        while not ctx.signal.wait(0.05):
            pass
        stopped.set()
        ctx.checkpoint(2, processed=2)

    def run() -> None:
        try:
            Attempt(store, Identity(job="busy44", slot="s", attempt=1, owner="w1"), options=Options(lease=1.0)).run(handler)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(30)
    # Given another writer holding the write lock until the holder's lease has lapsed (its renewals
    # gave up meanwhile), which then hands the lease to attempt 2 (what a takeover writes) and lets go
    other = sqlite3.connect(tmp_path / "checkpoints.db", isolation_level=None, timeout=5)
    other.execute("BEGIN IMMEDIATE")
    now = "((julianday('now') - 2440587.5) * 86400.0)"
    wait_until(lambda: other.execute(f"SELECT lease_expires_at < {now} - 0.5 FROM resumable_checkpoints "
                                     "WHERE job = 'busy44'").fetchone()[0] == 1, "the holder's lease to lapse", timeout=30)
    other.execute("UPDATE resumable_checkpoints SET lease_owner = 'w2', lease_token = lease_token + 1, attempt = 2 "
                  "WHERE job = 'busy44' AND slot = 's'")
    other.execute("COMMIT")
    other.close()
    assert stopped.wait(30), "the holder learned that its lease was gone"
    t.join(30)
    assert len(errors) == 1 and isinstance(errors[0], (LeaseLost, Cancelled)), errors
    text = str(errors[0])
    assert "this attempt had not renewed it for" in text and "(the store was busy: " in text, text
