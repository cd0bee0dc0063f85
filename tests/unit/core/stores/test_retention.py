"""Retention: ``clean`` removes finished slots past an age, with their history, in batches, and
never a running or leased slot. Against both stores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

import pytest

from airflow_resumable.cli import duration
from airflow_resumable.core import Attempt, Options
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import Store

DAY = 86400.0
JOB = "retention"


def finish(store: Store, slot: str, how: str) -> None:
    """A slot that ended ``how``: done, failed or cancelled."""
    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        if how == "failed":
            raise RuntimeError("boom")
        if how == "cancelled":
            ctx.signal.cancel("user")
            ctx.checkpoint(2, processed=2)

    try:
        Attempt(store, Identity(job=JOB, slot=slot, attempt=1, owner="o"), options=Options()).run(handler)
    except Exception:
        pass


def age(store: Store, slot: str, days: float) -> None:
    """Pretend the slot was last written ``days`` ago (in the database's own clock)."""
    with store.open() as s:
        s.execute(f"UPDATE resumable_checkpoints SET updated_at = {s.d.now_plus('%s')} WHERE job = %s AND slot = %s",
                  (-days * DAY, JOB, slot))
        s.commit()


def slots(store: Store) -> dict[str, str]:
    with store.open() as s:
        return {cp.slot: cp.status for cp in s.listings.list_slots(JOB, 100)}


def history(store: Store) -> set[str]:
    with store.open() as s:
        return {slot for (slot,) in s.execute("SELECT DISTINCT slot FROM resumable_attempts").fetchall()}


@pytest.fixture
def aged(store: Store) -> Store:
    """Old finished slots (done, failed, cancelled), an old one a retry holds the lease of, an old
    running one (its attempt died), and a recent done one."""
    for slot, how in (("old-done", "done"), ("old-failed", "failed"), ("old-cancelled", "cancelled"),
                      ("old-done-2", "done"), ("old-done-3", "done"), ("old-leased", "failed"), ("recent", "done")):
        finish(store, slot, how)
    with store.open() as s:
        assert s.leases.acquire(JOB, "old-leased", "a-retry", 30) is not None  # a retry took it, not started yet
        row = s.leases.acquire(JOB, "old-running", "dead", 30).row  # type: ignore[union-attr]
        s.checkpoints.start(Fence(JOB, "old-running", "dead", row.lease_token), 1, reset=True, resumed_from=None)
        s.execute("UPDATE resumable_checkpoints SET lease_owner = NULL WHERE slot = 'old-running'")  # lapsed, released
        s.commit()
    for slot in ("old-done", "old-failed", "old-cancelled", "old-done-2", "old-done-3", "old-leased", "old-running"):
        age(store, slot, 40)
    age(store, "recent", 1)
    return store


def test_clean_removes_finished_slots_past_the_age_with_their_history_in_batches(aged: Store) -> None:
    # When finished slots older than 30 days are cleaned, two per transaction
    with aged.open(autocommit=True) as s:
        cleaned = s.retention.clean(30 * DAY, batch=2)
    # Then the five old finished ones and their history records are gone
    assert (cleaned.slots, cleaned.records) == (5, 5)
    assert slots(aged) == {"old-leased": "failed", "old-running": "running", "recent": "done"}
    # and the leased, the running and the recent slots keep theirs
    assert history(aged) == {"old-leased", "recent"}


def test_a_dry_run_counts_and_changes_nothing(aged: Store) -> None:
    before = slots(aged)
    with aged.open() as s:
        would = s.retention.clean(30 * DAY, dry_run=True)
    assert (would.slots, would.records) == (5, 5)
    assert slots(aged) == before


def test_the_clean_command_removes_and_reports(aged: Store, store_uri: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "airflow_resumable", "clean", "--url", store_uri, *args],
                              capture_output=True, text=True, env=env, timeout=120)

    dry = cli("--older-than", "30d", "--dry-run")
    assert dry.returncode == 0 and "would remove 5 finished slot(s) and 5 history record(s)" in dry.stdout, dry.stderr
    assert len(slots(aged)) == 8
    done = cli("--older-than", "4w")
    assert done.returncode == 0 and "removed 5 finished slot(s)" in done.stdout, done.stderr
    assert set(slots(aged)) == {"old-leased", "old-running", "recent"}
    bad = cli("--older-than", "soon")
    assert bad.returncode == 2 and "'soon' is not a duration" in bad.stderr


@pytest.mark.parametrize(("text", "seconds"), [("30d", 30 * DAY), ("12h", 43200), ("90m", 5400), ("2w", 14 * DAY),
                                               ("3600s", 3600), ("1.5", 1.5), ("7D", 7 * DAY)])
def test_durations_take_a_unit(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0d", "-1d", "d", "30 days", "nan", "1e9"])
def test_a_duration_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is not a duration"):
        duration(text)
