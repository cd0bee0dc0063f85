"""A person's pause and a handover: the rule, as explicit as a cancel's. A pause accepted while an
earlier try of the task instance holds the slot (a try Airflow gave up, asked by the newer try to hand
over) was the task's, not that try's: it survives the handover, and the newer try pauses before any
work instead of running the slot on; a resume continues it, in that try. On both stores; each holder
runs on a thread of this process, its chunks deaf to the signal. A pause then another request
around the handover (a cancel, a forced release) ends as the later request says."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Options, Store
from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.errors import Paused
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.model.request_rules import Action
from airflow_resumable.core.model.states import AttemptEnd
from support.waits import wait_until

JOB, SLOT = "zombie.pause", "2026-05-01T00:00:00+00:00"
TI = Origin(dag_id="export", task_id="customers", run_id="scheduled__2026-05-01", map_index=-1)
ITEMS = 6


class Holder:
    """Try 1 of ``TI`` on a thread: chunks of ``chunk_s`` seconds deaf to the signal, read at each
    boundary; its lease keeper renews every ``heartbeat`` seconds (0.4 s unless told: it reads a pause
    with it). The lease is 6 s either way: a loaded machine's late renewal must not let try 2 take the
    slot over as lapsed, where a test waits for try 1 to stop at its boundary."""

    def __init__(self, store: Store, *, chunk_s: float, heartbeat: float | None = None):
        self.attempt = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="try1", origin=TI),
                               options=Options(lease=6.0), heartbeat=heartbeat or 0.4)
        self.chunk_s = chunk_s
        self.checkpoints = 0
        #: Set when a chunk begins; a chunk ends only while ``go`` is set (a test holds try 1 inside one).
        self.in_chunk = threading.Event()
        self.go = threading.Event()
        self.go.set()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _handler(self, ctx: Any) -> int:
        i = ctx.position or 0
        while i < ITEMS:
            self.in_chunk.set()
            time.sleep(self.chunk_s)  # a chunk of real work: the signal is read at its boundary only
            self.go.wait(30)
            i += 1
            ctx.checkpoint(i, processed=i, total=ITEMS)
            self.checkpoints += 1
        return i

    def _run(self) -> None:
        try:
            self.attempt.run(self._handler)
        except BaseException as exc:  # noqa: BLE001
            self.error = exc


def _count(ctx: Any) -> int:
    i = ctx.position or 0
    while i < ITEMS:
        i += 1
        ctx.checkpoint(i, processed=i, total=ITEMS)
    return i


def _ask(store: Store, action: Action, outcome: AttemptEnd, by: str = "alice") -> Any:
    with store.open() as s:
        s.ensure_schema()
        cp = s.requests.apply(JOB, SLOT, action, by=by, outcome=outcome)
        s.commit()
    assert cp is not None, action
    return cp


def _try2(store: Store, owner: str = "try2") -> Any:
    """Try 2 of the same task instance, run to its end: the outcome, or what it raised."""
    try:
        return Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner=owner, origin=TI),
                       options=Options(lease=1.2, lease_wait=0.1)).run(_count)
    except BaseException as exc:  # noqa: BLE001
        return exc


def _row(store: Store) -> Any:
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
        s.commit()
    return row


def test_a_pause_the_older_try_carried_out_while_the_newer_try_waited_pauses_the_newer_try_too(
        store: Store) -> None:
    """Given alice's pause of try 1's run, read by try 1's heartbeat in a long chunk, When try 2 of the
    same task instance waits for the slot (asking for a handover), sees the pause pending and try 1
    pauses for it, Then try 2 pauses before any work: the slot stays paused where try 1 left it, and
    alice's resume continues it in try 2 (before: try 2 resumed and ran the slot to done within
    seconds, the pause carried out only by a try Airflow no longer runs)."""
    holder = Holder(store, chunk_s=3.0)
    wait_until(lambda: holder.checkpoints >= 1, "try 1's first checkpoint")
    _ask(store, Action.PAUSE, AttemptEnd.PAUSE_REQUESTED)
    wait_until(lambda: holder.attempt.signal.cancelled, "try 1's heartbeat reading the pause", timeout=10)
    assert holder.attempt.signal.reason == "paused"
    waited = _try2(store)
    holder.thread.join(30)
    assert isinstance(holder.error, Paused), holder.error  # try 1 carried the pause out
    assert isinstance(waited, Paused) and waited.reason == "paused", waited
    assert "pause requested by alice while this attempt waited for the slot" in str(waited)
    row = _row(store)
    # (try 1's last chunk is saved by the checkpoint that stopped it: one more than it counted)
    assert (row.status, row.stop_reason, row.attempt, row.processed) == ("paused", "paused", 2, holder.checkpoints + 1)
    # the pause holds until someone resumes it; then try 2 continues from the checkpoint
    _ask(store, Action.RESUME, AttemptEnd.RESUME_REQUESTED, by="bob")
    resumed = _try2(store, owner="try2-resumed")
    assert not isinstance(resumed, BaseException), resumed
    assert resumed.checkpoint.status == "done" and resumed.resumed_from == row.processed


def test_a_pause_pending_when_the_older_try_stopped_for_the_handover_is_honoured_by_the_newer_try(
        store: Store) -> None:
    """Given alice's pause accepted while try 1 was in a chunk (its heartbeat too slow to read it), When
    try 2 asks for the handover before try 1's checkpoint, which then stops for the handover (the stop
    request says more than the pause), Then the pause stays on the row and try 2 pauses before any
    work (its start keeps a pending pause)."""
    holder = Holder(store, chunk_s=1.0, heartbeat=30.0)
    wait_until(lambda: holder.checkpoints >= 1, "try 1's first checkpoint")
    _ask(store, Action.PAUSE, AttemptEnd.PAUSE_REQUESTED)
    waited = _try2(store)
    holder.thread.join(30)
    assert getattr(holder.error, "reason", None) == "handover", holder.error
    assert isinstance(waited, Paused) and "pause requested by alice" in str(waited), waited
    row = _row(store)
    assert (row.status, row.stop_reason, row.attempt, row.request) == ("paused", "paused", 2, None)


@pytest.mark.parametrize("then", ["cancelled", "resumed"])
def test_a_pause_the_person_took_back_or_turned_into_a_cancel_before_the_handover_is_not_carried_over(
        store: Store, then: str) -> None:
    """A pause withdrawn (resumed) before try 1 read it leaves try 2 to run the slot to done; a cancel
    made after it stops try 2 as a cancel (the cancel's rule), never as a pause."""
    holder = Holder(store, chunk_s=1.0, heartbeat=30.0)
    wait_until(lambda: holder.checkpoints >= 1, "try 1's first checkpoint")
    _ask(store, Action.PAUSE, AttemptEnd.PAUSE_REQUESTED)
    if then == "resumed":
        _ask(store, Action.RESUME, AttemptEnd.RESUME_REQUESTED)
    else:
        _ask(store, Action.CANCEL, AttemptEnd.CANCEL_REQUESTED)
    waited = _try2(store)
    holder.thread.join(30)
    if then == "resumed":
        assert not isinstance(waited, BaseException) and waited.checkpoint.status == "done", waited
    else:
        assert not isinstance(waited, Paused) and getattr(waited, "reason", None) == "requested", waited


# -- a pause, then another request, around the handover ---------------------------------------------


def test_a_cancel_after_a_pause_try_1_already_read_stops_try_2_as_a_cancel(store: Store) -> None:
    """alice pauses; try 1's heartbeat reads it mid-chunk (its signal fired: it will pause at the
    boundary); bob then cancels while try 1 still runs its chunk. The cancel is the last word: try 2
    must not pause (nor run on): it stops as cancelled, and the slot ends cancelled."""
    holder = Holder(store, chunk_s=3.0)
    wait_until(lambda: holder.checkpoints >= 1, "try 1's first checkpoint")
    _ask(store, Action.PAUSE, AttemptEnd.PAUSE_REQUESTED)
    wait_until(lambda: holder.attempt.signal.cancelled, "try 1's heartbeat reading the pause", timeout=10)
    _ask(store, Action.CANCEL, AttemptEnd.CANCEL_REQUESTED, by="bob")
    waited = _try2(store)
    holder.thread.join(30)
    row = _row(store)
    assert not isinstance(waited, Paused), (waited, row.status, row.stop_reason, row.cancel_request)
    assert getattr(waited, "reason", None) == "requested", waited
    assert row.status == "cancelled", (row.status, row.stop_reason)


def test_a_cancel_of_the_slot_try_1_paused_while_try_2_waited_stops_try_2(store: Store) -> None:
    """alice pauses; try 1 pauses for it (the slot paused) while try 2 of the same task instance waits
    for the slot; bob cancels the paused slot before try 2's next look (cancelled at once, as the rules
    say of a paused slot). try 2 must stop as cancelled, not resume the cancelled slot and run it to
    done (try 1's deferral, which would have read the cancel, is a try Airflow no longer runs)."""
    holder = Holder(store, chunk_s=3.0)
    wait_until(lambda: holder.checkpoints >= 1, "try 1's first checkpoint")
    _ask(store, Action.PAUSE, AttemptEnd.PAUSE_REQUESTED)
    wait_until(lambda: holder.attempt.signal.cancelled, "try 1's heartbeat reading the pause", timeout=10)
    out: list[Any] = []
    # try 2 polls for the lease once a second (a long lease): room for bob's cancel between its looks
    t = threading.Thread(target=lambda: out.append(_run_try2(store)), daemon=True)
    t.start()
    wait_until(lambda: _row(store).status == "paused", "try 1 pausing", timeout=20)
    _ask(store, Action.CANCEL, AttemptEnd.CANCEL_REQUESTED, by="bob")
    t.join(60)
    holder.thread.join(30)
    row = _row(store)
    waited = out[0]
    assert isinstance(waited, BaseException) and getattr(waited, "reason", None) == "requested", (
        waited, row.status, row.processed)
    assert row.status == "cancelled", (row.status, row.processed)


def _run_try2(store: Store) -> Any:
    try:
        return Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="try2", origin=TI),
                       options=Options(lease=30.0, lease_wait=0.1)).run(_count)
    except BaseException as exc:  # noqa: BLE001
        return exc


def test_a_pause_pending_when_bob_releases_the_older_try_is_honoured_by_the_newer_try(store: Store) -> None:
    """alice pauses try 1's run (not read yet: a long chunk, a slow heartbeat); try 2 waits for the
    slot; bob force-releases try 1's lease. try 2 takes the slot and must pause before any work (the
    pause was the task's), and try 1's next write is fenced."""
    from airflow_resumable.core.control import requests as core_control

    holder = Holder(store, chunk_s=1.0, heartbeat=30.0)
    wait_until(lambda: holder.checkpoints >= 1, "try 1's first checkpoint")
    holder.go.clear()  # try 1 stays inside its chunk until let go
    _ask(store, Action.PAUSE, AttemptEnd.PAUSE_REQUESTED)
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(_try2(store)), daemon=True)
    t.start()
    wait_until(lambda: _row(store).cancel_request == "handover", "try 2 asking for the handover")
    core_control.release(store, JOB, SLOT, by="bob", force=True)
    t.join(60)
    holder.go.set()
    holder.thread.join(30)
    waited = out[0]
    assert isinstance(waited, Paused) and "pause requested by alice" in str(waited), waited
    assert type(holder.error).__name__ == "LeaseLost", holder.error
    row = _row(store)
    assert (row.status, row.stop_reason, row.attempt) == ("paused", "paused", 2), row


def test_a_pause_then_a_cancel_leaves_no_pause_for_the_clear_that_resumes_the_cancelled_slot(store: Store) -> None:
    """alice pauses try 1's run, bob then cancels it, before try 1's next checkpoint: try 1 stops
    cancelled (the cancel is the last word). Later carol Clears the task to resume the slot: her try
    must run on from the checkpoint, not defer on alice's old pause, which the cancel overtook."""
    holder = Holder(store, chunk_s=0.5, heartbeat=30.0)
    wait_until(lambda: holder.checkpoints >= 1, "try 1's first checkpoint")
    holder.go.clear()
    _ask(store, Action.PAUSE, AttemptEnd.PAUSE_REQUESTED)
    _ask(store, Action.CANCEL, AttemptEnd.CANCEL_REQUESTED, by="bob")
    holder.go.set()
    holder.thread.join(30)
    assert getattr(holder.error, "reason", None) == "requested", holder.error
    row = _row(store)
    assert row.status == "cancelled", row
    cleared = _try2(store, owner="carol-clear")
    assert not isinstance(cleared, BaseException) and cleared.checkpoint.status == "done", (cleared, row.request)
