"""Handover at its edges (found by an attack on it): a try that gives up waiting, a row that changed
hands between the look and the write, two newer tries, a person's cancel met on the way, an async
holder, a hand-edited row. Each holder runs on a thread of this process, its chunks deaf to the signal."""
from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_resumable.core import Attempt, LeaseBusy, Options, Store
from airflow_resumable.core.attempt import acquire
from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.errors import Cancelled
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores.leases import Leases
from support.waits import wait_until

JOB, SLOT = "zombie", "2026-05-01T00:00:00+00:00"
TI = Origin(dag_id="export", task_id="customers", run_id="scheduled__2026-05-01", map_index=-1)


def _schema(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        s.commit()


class Holder:
    """An attempt run on a thread; its chunks sleep ``chunk_s`` ignoring the signal (a long, real chunk),
    or each chunk its own of a tuple of them."""

    def __init__(self, store: Store, *, attempt: int, origin: Origin, owner: str, items: int,
                 chunk_s: float | tuple[float, ...],
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
            chunk_s = self.chunk_s[i] if isinstance(self.chunk_s, tuple) else self.chunk_s
            time.sleep(chunk_s)  # a chunk of real work: the signal is read at its boundary only
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
        wait_until(lambda: self.checkpoints >= n or not self.thread.is_alive(), f"{n} checkpoint(s) of the holder",
                   timeout)
        assert self.checkpoints >= n, (self.checkpoints, self.error)


def _noop(ctx: Any) -> int:
    ctx.checkpoint(1, processed=1)
    return 1


def _row(store: Store) -> Any:
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
        s.commit()
    return row


def _history(store: Store) -> list[tuple[Any, ...]]:
    """The slot's attempts, oldest first: (try, owner, outcome, stop reason)."""
    with store.open() as s:
        return [(r.attempt, r.owner, r.outcome, r.stop_reason) for r in s.listings.history(JOB, SLOT)]


def _in_thread(run: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """``run()`` on a thread; its result or error lands in the dict under ``"out"``."""
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["out"] = run()
        except BaseException as exc:  # noqa: BLE001
            box["out"] = exc

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, box


@pytest.mark.parametrize("gives_up", ["lease_busy", "timeout"])
def test_a_try_that_gives_up_waiting_takes_its_handover_back_and_the_holder_runs_on(
    store: Store, gives_up: str,
) -> None:
    """Given try 1 in a chunk longer than try 2 will wait (ten of try 2's 0.3 s leases, or try 2's own
    timeout), When try 2 asks it to hand over and gives up, Then its request is taken back and try 1
    runs the slot to the end: a request nobody waits for stops nobody (the slot ended cancelled with
    nobody left to resume it)."""
    _schema(store)
    holder = Holder(store, attempt=1, origin=TI, owner="try1", items=2, chunk_s=(0.05, 4.5), lease=1.2)
    holder.wait_checkpoints(1)
    options = Options(lease=0.3, lease_wait=0.1) if gives_up == "lease_busy" else Options(lease=1.2, timeout=1.0)
    waiter = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI), options=options)
    t0 = time.monotonic()
    thread, waited = _in_thread(lambda: waiter.run(_noop))
    # try 2 asked: the request is on the holder's row while it waits
    wait_until(lambda: _row(store).cancel_request == "handover" or not thread.is_alive(), "try 2's handover request")
    assert thread.is_alive(), ("try 2 ended before it asked", waited)
    thread.join(30)
    gave_up_after = time.monotonic() - t0
    # and gave up (within try 1's chunk), taking the request back
    assert isinstance(waited["out"], LeaseBusy if gives_up == "lease_busy" else Cancelled), waited
    assert gave_up_after < 4.5 and _row(store).cancel_request is None, gave_up_after
    # Then try 1 ran the slot to its end: its checkpoint after the chunk found no request
    holder.thread.join(30)
    row = _row(store)
    assert holder.error is None and holder.checkpoints == 2, holder.error
    assert (row.attempt, row.status, row.stop_reason, row.cancel_request) == (1, "done", None, None)
    assert _history(store) == [(1, "try1", "done", None)]


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
    wait_until(lambda: _row(store).lease_expires_at < datetime.now(timezone.utc), "try 1's lease to lapse")
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
    real_older, real_ask = acquire.older_try, acquire._ask_handover
    y_started, w_asked = threading.Event(), threading.Event()
    written: list[bool] = []

    def w_older(given, holder):
        ok = real_older(given, holder)
        if given.owner == "try2" and ok:
            y_go.set()
            assert y_started.wait(30), "Y did not start"
        return ok

    def w_ask(given, session, holder):
        mine, until = real_ask(given, session, holder)
        written.append(mine)
        w_asked.set()
        return mine, until

    import airflow_resumable.core.attempt.runner as runner_mod
    mp = pytest.MonkeyPatch()
    mp.setattr(runner_mod, "take_lease", y_take)
    mp.setattr(acquire, "older_try", w_older)
    mp.setattr(acquire, "_ask_handover", w_ask)
    y_err: list[BaseException] = []
    y_checkpoints = []

    def y_handler(ctx):
        # Y checkpoints until W has written (or been refused), then once more: a request on its row
        # would stop it there
        y_started.set()
        i = 0
        deadline = time.monotonic() + 30
        while True:
            last = w_asked.wait(0.05)
            assert last or time.monotonic() < deadline, "W never wrote nor was refused within 30 s"
            i += 1
            ctx.checkpoint(i, processed=i)
            y_checkpoints.append(i)
            if last:
                return i

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
    # W looked at a row naming try 1 of its task instance, and its write found Y's run there instead
    assert written == [False], (written, hist)
    # Y checkpointed after that write and ran on to its end; W then found the slot done
    assert not y_err and not w_err and y_checkpoints, (y_err, w_err, hist)
    assert hist == [(1, "Y", "manual__other", "done", None), (2, "try2", TI.run_id, "already_done", None)], hist
    assert _row(store).status == "done"


#: Hand edits of a held row's try number, and the stores whose column refuses each (PostgreSQL's is
#: an INTEGER: text is refused and 1.5 rounds to 2; SQLite's column keeps what it is given; both are
#: NOT NULL).
HAND_EDITS = [("'one'", {"postgres": "invalid input syntax for type integer"}), ("1.5", {}),
              ("NULL", {"sqlite": "NOT NULL constraint failed", "postgres": "violates not-null constraint"})]


@pytest.mark.parametrize(("value", "refused"), HAND_EDITS, ids=[v for v, _ in HAND_EDITS])
def test_hand_edited_attempt_on_a_held_row(store: Store, store_kind: str, value: str, refused: dict[str, str]) -> None:
    """Given a live holder's row whose try number was edited by hand, When a newer try compares it with
    its own, Then it fails as before the handover (LeaseBusy after lease_wait, or CorruptCheckpoint
    naming the column), never with a TypeError; where the store refuses the edit, the row keeps its own."""
    _schema(store)
    edit = (f"UPDATE resumable_checkpoints SET status = 'running', attempt = {value}, dag_id = %s, "
            "task_id = %s, run_id = %s, map_index = -1 WHERE job = %s AND slot = %s")
    with store.open() as s:
        assert s.leases.acquire(JOB, SLOT, "holder", 30) is not None
        s.commit()
        if store_kind in refused:
            with pytest.raises(Exception, match=refused[store_kind]):
                s.execute(edit, (TI.dag_id, TI.task_id, TI.run_id, JOB, SLOT))
            s.rollback()
            assert s.checkpoints.load(JOB, SLOT).attempt == 0
            return
        s.execute(edit, (TI.dag_id, TI.task_id, TI.run_id, JOB, SLOT))
        s.commit()
    run = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI),
                  options=Options(lease=3, lease_wait=0.3))
    from airflow_resumable.core.model.errors import CorruptCheckpoint
    began = time.monotonic()
    with pytest.raises((LeaseBusy, CorruptCheckpoint)) as info:
        run.run(_noop)
    # (a try that asked for a handover would wait ten of its leases, 30 s, not its lease_wait)
    assert JOB in str(info.value) and time.monotonic() - began < 5, info.value
    assert (_row_as_stored(store), _history(store)) == (("running", "holder", None), []), info.value


def _row_as_stored(store: Store) -> tuple[Any, ...]:
    """The row's status, lease owner and stop request, read without decoding it (its try number may
    not be one)."""
    with store.open() as s:
        got = s.execute("SELECT status, lease_owner, cancel_request FROM resumable_checkpoints").fetchall()
        s.commit()
    assert len(got) == 1, got
    return tuple(got[0])


def test_an_async_holder_hands_over_at_its_checkpoint(store: Store) -> None:
    import asyncio
    _schema(store)
    state = {"n": 0, "err": None}

    async def handler(ctx: Any) -> int:
        i = ctx.position or 0
        while i < 60:
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
    wait_until(lambda: state["n"] >= 3 or not t.is_alive(), "try 1's third checkpoint")
    assert state["n"] >= 3, state
    out = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI),
                  options=Options(lease=1.2, lease_wait=0.1)).run(handler)
    t.join(10)
    assert isinstance(state["err"], Cancelled) and state["err"].reason == "handover", state["err"]
    assert out.checkpoint.status == "done" and out.resumed_from and out.checkpoint.processed == 60, out
    assert _history(store) == [(1, "try1", "cancelled", "handover"), (2, "try2", "done", None)]


def test_a_third_try_asks_the_second_try_that_took_the_slot_in_turn(
    store: Store, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given tries 2 and 3 both waiting on try 1 (try 3 finds try 2's handover pending), When try 2 takes
    the slot, Then try 3 asks try 2 in turn and runs the slot: it was asked once per waiter, not once
    per holder, and failed LeaseBusy while try 2, which Airflow no longer runs, kept the slot."""
    _schema(store)
    holder = Holder(store, attempt=1, origin=TI, owner="try1", items=3, chunk_s=1.0, lease=1.2)
    holder.wait_checkpoints(1)
    # try 2 takes the slot first: try 3's looks find it held until then
    try2_took = threading.Event()
    real_acquire = Leases.acquire

    def acquire_in_turn(self: Leases, job: str, slot: str, owner: str, lease_seconds: float, **start: Any) -> Any:
        if owner == "try3" and not try2_took.is_set():
            return None
        got = real_acquire(self, job, slot, owner, lease_seconds, **start)
        if owner == "try2" and got is not None:
            try2_took.set()
        return got

    monkeypatch.setattr(Leases, "acquire", acquire_in_turn)

    def until_stopped(ctx: Any) -> int:
        i = ctx.position or 0
        while i < 400:
            time.sleep(0.05)  # a chunk of work; try 3's request stops it at the next checkpoint
            i += 1
            ctx.checkpoint(i, processed=i)
        return i

    def try_(name: str, attempt: int, handler: Any) -> Any:
        return lambda: Attempt(store, Identity(job=JOB, slot=SLOT, attempt=attempt, owner=name, origin=TI),
                               options=Options(lease=1.2, lease_wait=0.1)).run(handler)

    t2, try2 = _in_thread(try_("try2", 2, until_stopped))
    wait_until(lambda: _row(store).cancel_request == "handover" or not t2.is_alive(), "try 2's handover request")
    t3, try3 = _in_thread(try_("try3", 3, _noop))
    t3.join(60)
    t2.join(60)
    holder.thread.join(30)
    hist = _history(store)
    assert isinstance(try2["out"], Cancelled) and try2["out"].reason == "handover", (try2, hist)
    assert not isinstance(try3["out"], BaseException) and try3["out"].checkpoint.status == "done", (try3, hist)
    assert isinstance(holder.error, Cancelled) and holder.error.reason == "handover", holder.error
    assert hist == [(1, "try1", "cancelled", "handover"), (2, "try2", "cancelled", "handover"),
                    (3, "try3", "done", None)], hist


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
