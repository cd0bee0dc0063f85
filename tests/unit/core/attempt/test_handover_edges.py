"""Handover at its edges (found by an attack on it): a try that gives up waiting, a row that changed
hands between the look and the write, two newer tries, a person's cancel met on the way, an async
holder, a hand-edited row. Each holder runs on a thread of this process, its chunks deaf to the signal."""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from airflow_resumable.core import Attempt, LeaseBusy, Options, Store
from airflow_resumable.core.attempt import acquire
from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.errors import Cancelled
from airflow_resumable.core.model.identity import Identity

JOB, SLOT = "zombie", "2026-05-01T00:00:00+00:00"
TI = Origin(dag_id="export", task_id="customers", run_id="scheduled__2026-05-01", map_index=-1)


def _schema(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        s.commit()


class Holder:
    """An attempt run on a thread; its chunks sleep ``chunk_s`` ignoring the signal (a long, real chunk)."""

    def __init__(self, store: Store, *, attempt: int, origin: Origin, owner: str, items: int, chunk_s: float,
                 lease: float, job: str = JOB, slot: str = SLOT):
        self.attempt = Attempt(store, Identity(job=job, slot=slot, attempt=attempt, owner=owner, origin=origin),
                               options=Options(lease=lease))
        self.items, self.chunk_s = items, chunk_s
        self.checkpoints = 0
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _handler(self, ctx: Any) -> int:
        i = ctx.position or 0
        while i < self.items:
            time.sleep(self.chunk_s)  # a chunk of real work: the signal is read at its boundary only
            i += 1
            ctx.checkpoint(i, processed=i, total=self.items)
            self.checkpoints += 1
        return i

    def _run(self) -> None:
        try:
            self.result = self.attempt.run(self._handler)
        except BaseException as exc:  # noqa: BLE001
            self.error = exc

    def wait_checkpoints(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.checkpoints < n:
            assert time.monotonic() < deadline and self.thread.is_alive(), (self.checkpoints, self.error)
            time.sleep(0.02)


def _noop(ctx: Any) -> int:
    ctx.checkpoint(1, processed=1)
    return 1


@pytest.mark.parametrize("gives_up", ["lease_busy", "timeout"])
def test_a_try_that_gives_up_waiting_takes_its_handover_back_and_the_holder_runs_on(
    store: Store, gives_up: str,
) -> None:
    """Given try 1 in a chunk longer than try 2 will wait (ten of try 2's 0.3 s leases, or try 2's own
    timeout), When try 2 asks it to hand over and gives up, Then its request is taken back and try 1
    runs the slot to the end: a request nobody waits for stops nobody (the slot ended cancelled with
    nobody left to resume it)."""
    _schema(store)
    holder = Holder(store, attempt=1, origin=TI, owner="try1", items=2, chunk_s=4.5, lease=1.2)
    holder.wait_checkpoints(1)
    options = Options(lease=0.3, lease_wait=0.1) if gives_up == "lease_busy" else Options(lease=1.2, timeout=1.0)
    waiter = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI), options=options)
    t0 = time.monotonic()
    with pytest.raises(LeaseBusy if gives_up == "lease_busy" else Cancelled):
        waiter.run(_noop)
    gave_up_after = time.monotonic() - t0
    holder.thread.join(30)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert holder.error is None and row.status == "done", (holder.error, row.status, row.stop_reason)
    assert row.cancel_request is None and gave_up_after < 4.5


def test_a_holder_of_another_dag_run_that_started_after_the_look_is_not_asked(store: Store) -> None:
    """Given attempt Y of another DAG run that took the lapsed lease of a dead try 1 (the row still
    names try 1's task instance), When try 2 of that task instance looks at the row before Y's start
    and writes after it, Then the write finds the row names Y's run and asks nothing: Y is not
    cancelled (the write checked only the lease owner)."""
    _schema(store)
    with store.open() as s:  # try 1 of TI ran and died: row running, its lease lapsed
        assert s.leases.acquire(JOB, SLOT, "try1-dead", 0.2) is not None
        s.execute("UPDATE resumable_checkpoints SET status = 'running', attempt = 1, dag_id = %s, task_id = %s, "
                  "run_id = %s, map_index = -1 WHERE job = %s AND slot = %s",
                  (TI.dag_id, TI.task_id, TI.run_id, JOB, SLOT))
        s.commit()
    time.sleep(0.3)
    other = Origin(dag_id="export", task_id="customers", run_id="manual__other", map_index=-1)
    # Y, another DAG run's try 1, takes the lapsed lease first; hold it just after acquire (before start)
    y_acquired, y_go = threading.Event(), threading.Event()
    real_take = acquire.take_lease

    def y_take(given, session):
        held = real_take(given, session)
        if given.owner == "Y":
            y_acquired.set()
            y_go.wait(10)
        return held

    # W's look happens while Y has acquired but not started; its write after Y's start
    real_older = acquire.older_try
    y_started = threading.Event()

    def w_older(given, holder):
        ok = real_older(given, holder)
        if given.owner == "try2" and ok:
            y_go.set()
            y_started.wait(10)
            time.sleep(0.3)
        return ok

    import airflow_resumable.core.attempt.runner as runner_mod
    mp = pytest.MonkeyPatch()
    mp.setattr(runner_mod, "take_lease", y_take)
    mp.setattr(acquire, "older_try", w_older)
    y_err: list[BaseException] = []
    y_checkpoints = []

    def y_handler(ctx):
        y_started.set()
        for i in range(40):
            time.sleep(0.1)
            ctx.checkpoint(i + 1, processed=i + 1)
            y_checkpoints.append(i)
        return 40

    def run_y():
        try:
            Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="Y", origin=other),
                    options=Options(lease=1.2)).run(y_handler)
        except BaseException as exc:  # noqa: BLE001
            y_err.append(exc)

    try:
        ty = threading.Thread(target=run_y, daemon=True)
        ty.start()
        assert y_acquired.wait(10)
        w_err: list[BaseException] = []

        def run_w():
            try:
                Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI),
                        options=Options(lease=1.2, lease_wait=0.1)).run(_noop)
            except BaseException as exc:  # noqa: BLE001
                w_err.append(exc)

        tw = threading.Thread(target=run_w, daemon=True)
        tw.start()
        ty.join(30)
        tw.join(30)
    finally:
        mp.undo()
    with store.open() as s:
        hist = [(r.attempt, r.owner, r.run_id, r.outcome, r.stop_reason) for r in s.listings.history(JOB, SLOT)]
    assert not (y_err and isinstance(y_err[0], Cancelled) and y_err[0].reason == "handover"), (y_err, hist)


@pytest.mark.parametrize("value", ["'one'", "1.5", "NULL"])
def test_hand_edited_attempt_on_a_held_row(store: Store, value: str) -> None:
    """Given a live holder's row whose try number was edited by hand, When a newer try compares it with
    its own, Then it fails as before the handover (LeaseBusy after lease_wait, or CorruptCheckpoint
    naming the column), never with a TypeError."""
    _schema(store)
    with store.open() as s:
        assert s.leases.acquire(JOB, SLOT, "holder", 30) is not None
        try:
            s.execute(f"UPDATE resumable_checkpoints SET status = 'running', attempt = {value}, dag_id = %s, "
                      "task_id = %s, run_id = %s, map_index = -1 WHERE job = %s AND slot = %s",
                      (TI.dag_id, TI.task_id, TI.run_id, JOB, SLOT))
            s.commit()
        except Exception as exc:  # noqa: BLE001
            pytest.skip(f"the store refuses it: {exc}")
    run = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI),
                  options=Options(lease=30, lease_wait=0.3))
    from airflow_resumable.core.model.errors import CorruptCheckpoint
    with pytest.raises((LeaseBusy, CorruptCheckpoint)) as info:
        run.run(_noop)
    assert JOB in str(info.value)


def test_an_async_holder_hands_over_at_its_checkpoint(store: Store) -> None:
    import asyncio
    _schema(store)
    state = {"n": 0, "err": None}

    async def handler(ctx: Any) -> int:
        i = ctx.position or 0
        while i < 200:
            await asyncio.sleep(0.05)
            i += 1
            await ctx.acheckpoint(i, processed=i)
            state["n"] = i
        return i

    def run1():
        try:
            Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="try1", origin=TI),
                    options=Options(lease=1.2)).run(handler)
        except BaseException as exc:  # noqa: BLE001
            state["err"] = exc

    t = threading.Thread(target=run1, daemon=True)
    t.start()
    while state["n"] < 3:
        time.sleep(0.02)
    out = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI),
                  options=Options(lease=1.2, lease_wait=0.1)).run(handler)
    t.join(10)
    assert isinstance(state["err"], Cancelled) and state["err"].reason == "handover", state["err"]
    assert out.checkpoint.status == "done" and out.resumed_from, out


def test_a_third_try_asks_the_second_try_that_took_the_slot_in_turn(store: Store) -> None:
    """Given tries 2 and 3 both waiting on try 1 (try 3 finds try 2's handover pending), When try 2 takes
    the slot, Then try 3 asks try 2 in turn and runs the slot: it was asked once per waiter, not once
    per holder, and failed LeaseBusy while try 2, which Airflow no longer runs, kept the slot."""
    _schema(store)
    holder = Holder(store, attempt=1, origin=TI, owner="try1", items=3, chunk_s=1.0, lease=1.2)
    holder.wait_checkpoints(1)
    res: dict[str, Any] = {}

    def slow(ctx: Any) -> int:
        i = ctx.position or 0
        while i < 200:
            time.sleep(0.1)
            i += 1
            ctx.checkpoint(i, processed=i)
        return i

    def go(name: str, attempt: int, lease: float) -> None:
        try:
            res[name] = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=attempt, owner=name, origin=TI),
                                options=Options(lease=lease, lease_wait=0.1)).run(slow)
        except BaseException as exc:  # noqa: BLE001
            res[name] = exc

    t2 = threading.Thread(target=go, args=("try2", 2, 1.2), daemon=True)
    t2.start()
    time.sleep(0.2)
    t3 = threading.Thread(target=go, args=("try3", 3, 6.0), daemon=True)  # polls slower: try 2 wins the slot
    t3.start()
    t3.join(60)
    t2.join(60)
    with store.open() as s:
        hist = [(r.attempt, r.outcome, r.stop_reason) for r in s.listings.history(JOB, SLOT)]
    assert not isinstance(res["try3"], BaseException), (res, hist)


def _cancel(store: Store, by: str = "alice") -> Any:
    from airflow_resumable.core.model.request_rules import Action
    from airflow_resumable.core.model.states import AttemptEnd
    with store.open() as s:
        cp = s.requests.apply(JOB, SLOT, Action.CANCEL, by=by, outcome=AttemptEnd.CANCEL_REQUESTED)
        s.commit()
    return cp


def _count(ctx: Any) -> int:
    i = ctx.position or 0
    while i < 20:
        i += 1
        ctx.checkpoint(i, processed=i)
    return i


def test_a_persons_cancel_met_while_waiting_stops_the_newer_try_too(store: Store) -> None:
    """Given alice's cancel of try 1's run (the UI: its task fails without a retry), When try 2 of the
    same task instance, waiting for the slot, sees it pending and try 1 stops for it, Then try 2 stops
    before any work too (it resumed and finished the slot alice had cancelled)."""
    _schema(store)
    holder = Holder(store, attempt=1, origin=TI, owner="try1", items=20, chunk_s=0.3, lease=1.2)
    holder.wait_checkpoints(1)
    assert _cancel(store) is not None
    out_or_err: Any
    try:
        out_or_err = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI),
                             options=Options(lease=1.2, lease_wait=0.1)).run(_count)
    except BaseException as exc:  # noqa: BLE001
        out_or_err = exc
    holder.thread.join(10)
    assert isinstance(out_or_err, Cancelled) and out_or_err.reason == "requested", out_or_err
    assert "while this attempt waited for the slot" in str(out_or_err)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    # (the checkpoint that met the cancel was written before it stopped try 1, or not, by timing)
    assert (row.status, row.stop_reason) == ("cancelled", "requested")
    assert row.processed in (holder.checkpoints, holder.checkpoints + 1), (row.processed, holder.checkpoints)


def test_a_cancel_that_came_after_the_attempt_stopped_for_another_reason_stays_for_the_next(store: Store) -> None:
    """Given an attempt stopping for one reason (here its handler's own ``shutdown``; a handover or a
    timeout the same) just after alice's cancel was accepted, When it ends, Then the cancel stays on
    the row and the next attempt stops with it before any work (its end cleared the request: the next
    attempt resumed and finished the slot alice had cancelled)."""
    _schema(store)

    def stops_after_the_cancel(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        assert _cancel(store) is not None  # accepted: the holder is live
        raise Cancelled("shutdown", "the worker is shutting down")

    with pytest.raises(Cancelled):
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="try1", origin=TI),
                options=Options(lease=1.2)).run(stops_after_the_cancel)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.status, row.stop_reason, row.cancel_request) == ("cancelled", "shutdown", "requested")
    with pytest.raises(Cancelled) as stopped:
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI),
                options=Options(lease=1.2)).run(_count)
    assert stopped.value.reason == "requested" and "alice" in str(stopped.value)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.status, row.stop_reason, row.processed, row.cancel_request) == ("cancelled", "requested", 1, None)
