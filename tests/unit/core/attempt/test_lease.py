"""Guarantee 5, fencing: one live attempt per slot; a stale one is rejected and stops itself."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import Attempt, LeaseBusy, Options, Store
from airflow_resumable.core.model.identity import Identity
from support.lease_worker import JOB, SLOT, Worker, make_sink
from support.waits import wait_until


def lease_expired(store: Store) -> bool:
    with store.open() as s:
        cur = s.execute(f"SELECT lease_expires_at < {s.d.now()} FROM resumable_checkpoints WHERE job = %s AND slot = %s", (JOB, SLOT))
        (expired,) = cur.fetchone()
        s.commit()
    return bool(expired)


def test_a_stale_attempt_is_fenced_off_and_stops_within_a_heartbeat_and_a_chunk(store: Store) -> None:
    lease, chunk_s, items, chunk = 0.9, 0.1, 300, 10
    heartbeat = lease / 3
    make_sink(store)
    # Given attempt 1 running, then frozen (a partitioned worker: no heartbeats, no progress)
    a = Worker(store, attempt=1, items=items, chunk=chunk, chunk_s=chunk_s, lease=lease)
    frozen_at = a.wait_checkpoints(5)["position"]
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: lease_expired(store), what="the frozen attempt's lease to expire")
        # When attempt 2 takes the slot over and makes progress
        b = Worker(store, attempt=2, items=items, chunk=chunk, chunk_s=chunk_s, lease=lease)
        b.wait_checkpoints(3)
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    woke = time.time()
    # Then the stale attempt learns it lost the lease and stops, writing nothing more
    stop = a.stopped(timeout=30)
    assert stop["error"] in ("LeaseLost", "Cancelled") and stop["reason"] in (None, "lease_lost"), stop
    assert stop["t"] - woke <= heartbeat + chunk_s + 1.0, f"stopped {stop['t'] - woke:.2f}s after waking"
    assert a.proc.wait(30) == 3
    assert b.stopped(timeout=120)["error"] is None and b.proc.wait(30) == 0
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
        cur = s.conn.cursor()
        cur.execute("SELECT item, count(*) FROM sink GROUP BY item HAVING count(*) <> 1")
        assert cur.fetchall() == []
        cur.execute("SELECT max(item) FROM sink WHERE owner LIKE 'attempt1-%'")
        assert cur.fetchone()[0] == frozen_at - 1, "attempt 1 wrote nothing after it was frozen"
        cur.execute("SELECT count(*) FROM sink")
        assert cur.fetchone()[0] == items
    assert (row.status, row.position, row.attempt) == ("done", items, 2)
    assert row.resumed_from == frozen_at


def _spin(seconds: float) -> int:
    """Pure-Python CPU work that never yields on purpose."""
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        n += sum(i * i for i in range(200))
    return n


def test_heartbeats_go_on_while_the_handler_burns_cpu_for_ten_leases(store: Store) -> None:
    lease = 0.5
    intruder: list[Any] = []

    def handler(ctx) -> None:
        _spin(10 * lease)
        with store.open() as other:  # another attempt tries to take the slot meanwhile
            intruder.append(other.leases.acquire(JOB, SLOT, "intruder", lease))
        ctx.checkpoint(1, processed=1)  # fenced: fails if the lease had been lost

    run = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="cpu"), options=Options(lease=lease))
    outcome = run.run(handler)
    assert outcome.checkpoint.status == "done"
    assert intruder == [None], "the lease stayed live: nobody else could take the slot"
    assert not run.keeper.lost and run.keeper.beats >= 10 * 3 * 0.6


class _GatedHeartbeats:
    """The store, with each lease heartbeat held at a gate once it has started: a heartbeat in flight."""

    def __init__(self, store: Store):
        self.store = store
        self.entered, self.gate = threading.Event(), threading.Event()

    def session(self, **kw: Any) -> Any:
        session = self.store.session(**kw)
        real = session.leases.heartbeat

        def heartbeat(*args: Any) -> Any:
            self.entered.set()
            assert self.gate.wait(30), "the test never opened the gate"
            return real(*args)

        session.leases.heartbeat = heartbeat
        return session


def test_a_heartbeat_in_flight_as_the_attempt_ends_does_not_report_the_lease_lost(store: Store) -> None:
    from airflow_resumable.core.attempt.lease import LeaseKeeper
    from airflow_resumable.core.attempt.signal import Signal
    from airflow_resumable.core.model.fence import Fence

    # Given a keeper whose heartbeat has started when the attempt asks it to stop
    with store.open() as s:
        s.ensure_schema()
        taken = s.leases.acquire(JOB, SLOT, "ending", 30)
    assert taken is not None
    gated, signal_ = _GatedHeartbeats(store), Signal()
    keeper = LeaseKeeper(gated, Fence.of(taken[0]), lease_seconds=30, signal=signal_, interval=0.01).start()  # type: ignore[arg-type]
    assert gated.entered.wait(30), "the keeper sent no heartbeat within 30 s"
    keeper.stop(join=False)
    # When the attempt's end releases the lease before that heartbeat lands
    _take_over(store)
    gated.gate.set()
    keeper.stop()
    # Then the finished attempt is not told it lost its lease
    assert not keeper.lost and signal_.reason is None, signal_.message


def test_an_attempt_waits_bounded_for_a_live_holder_then_gives_up_naming_it(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        assert s.leases.acquire(JOB, SLOT, "holder", 30) is not None
    run = Attempt(
        store, Identity(job=JOB, slot=SLOT, attempt=2, owner="late"), options=Options(lease=30, lease_wait=0.3),
    )
    with pytest.raises(LeaseBusy, match=r"another attempt \(holder\) still holds this slot's lease") as err:
        run.run(lambda ctx: None)
    assert err.value.holder == "holder" and JOB in str(err.value)


def test_an_attempt_takes_over_once_a_dead_holder_s_lease_lapses(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        assert s.leases.acquire(JOB, SLOT, "dead", 0.5) is not None
    started = time.monotonic()
    outcome = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="next"), options=Options(lease=0.5)).run(
        lambda ctx: ctx.checkpoint(1)
    )
    assert outcome.checkpoint.status == "done" and time.monotonic() - started < 5


def _delete_row(store: Store) -> None:
    """What someone does by hand while the attempt runs: ``DELETE FROM resumable_checkpoints WHERE ...``."""
    with store.open() as s:
        s.execute("DELETE FROM resumable_checkpoints WHERE job = %s AND slot = %s", (JOB, SLOT))
        s.commit()


def _take_over(store: Store) -> None:
    """What another attempt's acquire does to the row: a new owner and token."""
    with store.open() as s:
        s.execute("UPDATE resumable_checkpoints SET lease_owner = 'other', lease_token = lease_token + 1 "
                  "WHERE job = %s AND slot = %s", (JOB, SLOT))
        s.commit()


@pytest.mark.parametrize("mode", ["transactional", "plain", "pipelined"])
def test_a_row_deleted_while_the_attempt_runs_is_reported_as_deleted_and_not_retried(store: Store, mode: str) -> None:
    from airflow_resumable.core.model.errors import CheckpointDeleted
    from airflow_resumable.operators.outcome import to_airflow
    from airflow_resumable.version_compat import AirflowFailException

    with store.open() as s:
        s.ensure_schema()
        s.execute("CREATE TABLE sink (item INTEGER NOT NULL)")
        s.commit()

    # Given an attempt that saved a chunk, and then someone deletes its slot's row
    transactional = mode == "transactional"

    def handler(ctx: Any) -> None:
        write = ctx.transaction().execute if transactional else (lambda *a: None)
        write("INSERT INTO sink (item) VALUES (%s)", (1,))
        ctx.checkpoint(1, processed=1)
        _delete_row(store)
        write("INSERT INTO sink (item) VALUES (%s)", (2,))
        ctx.checkpoint(2, processed=2)  # the fenced write matches no row

    options = Options(pipeline_checkpoints=mode == "pipelined")
    with pytest.raises(CheckpointDeleted) as err:
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o1"), options=options).run(handler)
    # Then the error says the row is gone (not that another attempt took it over) and what to do
    text = str(err.value)
    assert "checkpoint row was deleted" in text and "no other attempt took it over" in text, text
    assert "taken over by another attempt" not in text
    assert f"job='{JOB}'" in text and f"slot='{SLOT}'" in text and "Clear the task" in text
    # and it is not retried (a retry would start the slot over unasked), and the row is not re-created
    assert isinstance(to_airflow(err.value, job=JOB, slot=SLOT), AirflowFailException)
    with store.open() as s:
        assert s.checkpoints.load(JOB, SLOT) is None
        items = [r[0] for r in s.execute("SELECT item FROM sink ORDER BY item").fetchall()]
        s.commit()
    assert items == ([1] if transactional else [])  # the uncommitted chunk's write was rolled back


def test_a_row_deleted_that_the_lease_keeper_notices_first_is_reported_as_deleted(store: Store) -> None:
    from airflow_resumable.core.model.errors import CheckpointDeleted

    # Given an attempt whose heartbeat finds the row deleted before its next checkpoint
    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        _delete_row(store)
        assert ctx.signal.wait(30), "the lease keeper did not notice the deleted row within 30 s"
        assert "deleted" in (ctx.signal.message or "")
        ctx.checkpoint(2, processed=2)

    # Then the attempt ends with the same named error
    with pytest.raises(CheckpointDeleted, match="checkpoint row was deleted"):
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o1"), heartbeat=0.05).run(handler)


def test_a_takeover_is_still_reported_as_one_and_retried(store: Store) -> None:
    from airflow_resumable.core.model.errors import CheckpointDeleted, LeaseLost
    from airflow_resumable.operators.outcome import to_airflow
    from airflow_resumable.version_compat import AirflowException, AirflowFailException

    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        _take_over(store)
        ctx.checkpoint(2, processed=2)

    with pytest.raises(LeaseLost, match="taken over by another attempt") as err:
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o1")).run(handler)
    assert not isinstance(err.value, CheckpointDeleted)
    airflow = to_airflow(err.value, job=JOB, slot=SLOT)
    assert isinstance(airflow, AirflowException) and not isinstance(airflow, AirflowFailException)


def test_a_lost_lease_names_the_attempt_that_took_it_over(store: Store) -> None:
    from airflow_resumable.core.model.errors import LeaseLost

    took, go_on = threading.Event(), threading.Event()
    second: dict[str, Any] = {}

    def other(ctx: Any) -> None:  # attempt 2 runs while attempt 1 is still inside its chunk
        took.set()
        go_on.wait(30)
        ctx.checkpoint(5, processed=5)

    def first(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        with store.open() as s:  # the lease lapses (as a frozen holder's does)
            s.execute(f"UPDATE resumable_checkpoints SET lease_expires_at = {s.d.now()} WHERE job = %s AND slot = %s",
                      (JOB, SLOT))
            s.commit()
        runner = threading.Thread(target=lambda: second.update(
            outcome=Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="worker-b/try2")).run(other)))
        runner.start()
        second["thread"] = runner
        assert took.wait(30), "attempt 2 never started"
        ctx.checkpoint(2, processed=2)

    with pytest.raises(LeaseLost) as err:
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="worker-a/try1")).run(first)
    go_on.set()
    second["thread"].join(30)
    # The error, and the history's record of attempt 1, say who holds the slot now
    assert "attempt 2 (owner 'worker-b/try2'" in err.value.message, err.value.message
    with store.open() as s:
        (error,) = s.execute("SELECT error FROM resumable_attempts WHERE job = %s AND attempt = 1", (JOB,)).fetchone()
        s.commit()
    assert "attempt 2 (owner 'worker-b/try2'" in error
    assert second["outcome"].checkpoint.status == "done"


def test_a_lease_released_while_held_is_not_blamed_on_another_attempt(store: Store) -> None:
    from airflow_resumable.core.model.errors import LeaseLost

    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        with store.open() as s:  # what a forced Release writes
            s.execute("UPDATE resumable_checkpoints SET lease_owner = NULL, lease_expires_at = NULL "
                      "WHERE job = %s AND slot = %s", (JOB, SLOT))
            s.commit()
        ctx.checkpoint(2, processed=2)

    with pytest.raises(LeaseLost) as err:
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o1")).run(handler)
    assert "no attempt holds it now: it was released" in err.value.message, err.value.message


def test_a_lease_taken_by_an_attempt_that_has_ended_since_names_that_attempt_not_a_release(store: Store) -> None:
    from airflow_resumable.core.model.errors import LeaseLost

    def first(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        with store.open() as s:  # the lease lapses (as a frozen holder's does), and attempt 2 runs to the end
            s.execute(f"UPDATE resumable_checkpoints SET lease_expires_at = {s.d.now()} WHERE job = %s AND slot = %s",
                      (JOB, SLOT))
            s.commit()
        runner = threading.Thread(target=lambda: Attempt(
            store, Identity(job=JOB, slot=SLOT, attempt=2, owner="worker-b/try2")).run(lambda c: c.checkpoint(5)))
        runner.start()
        runner.join(30)
        ctx.checkpoint(2, processed=2)

    with pytest.raises(LeaseLost) as err:
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="worker-a/try1")).run(first)
    assert "attempt 2 (owner 'worker-b/try2'" in err.value.message and "ended 'done'" in err.value.message, \
        err.value.message
    assert "released" not in err.value.message


def test_a_lost_lease_s_message_carries_no_credential_a_hand_wrote_into_the_owner(store: Store) -> None:
    from airflow_resumable.core.model.errors import LeaseLost

    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        with store.open() as s:
            s.execute("UPDATE resumable_checkpoints SET lease_owner = %s, lease_token = lease_token + 1 "
                      "WHERE job = %s AND slot = %s", ("postgresql://admin:Sup3rS3cret@db/prod\x1b[2J", JOB, SLOT))
            s.commit()
        ctx.checkpoint(2, processed=2)

    with pytest.raises(LeaseLost) as err:
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o1")).run(handler)
    assert "Sup3rS3cret" not in str(err.value) and "\x1b" not in str(err.value), str(err.value)
    assert "holds it now" in str(err.value)


def test_a_holder_whose_own_renewals_fail_for_a_whole_lease_stops_saying_so_and_why(tmp_path: Path) -> None:
    from airflow_resumable.core import SQLiteStore
    from airflow_resumable.core.attempt.lease import LeaseKeeper
    from airflow_resumable.core.attempt.signal import Reason, Signal
    from airflow_resumable.core.model.fence import Fence

    store = SQLiteStore(tmp_path / "checkpoints.db")
    with store.open() as s:
        s.ensure_schema()
        row = s.leases.acquire(JOB, SLOT, "o1", 0.9).row  # type: ignore[union-attr]
        # The checkpoint table goes away under the holder (a restore gone wrong): every renewal fails,
        # and not because another writer holds the lock
        s.execute("ALTER TABLE resumable_checkpoints RENAME TO gone")
        s.commit()
    signal = Signal()
    keeper = LeaseKeeper(store, Fence.of(row), lease_seconds=0.9, signal=signal, interval=0.1).start()
    try:
        assert signal.wait(10), "the keeper never gave the lease up"
    finally:
        keeper.stop()
    assert signal.reason == Reason.LEASE_LOST
    assert (signal.message or "").startswith("this attempt could not renew its lease for "), signal.message
    assert "no such table" in (signal.message or "") and "another attempt may take the slot over" in (signal.message or "")
