"""Pause, resume, cancel, restart and release through the core's control API, with the attempt loop;
throttling and time slices. No Airflow: the deferral itself is tested in tests/unit/operators/test_deferral.py.

Given / When / Then, against both stores.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from airflow_resumable.core import (
    Attempt,
    Cancelled,
    ConfigurationError,
    LeaseBusy,
    LeaseLost,
    Options,
    OverlapSkip,
    Paused,
    RequestRefused,
    SlotNotFound,
    Store,
    control,
)
from airflow_resumable.core.model.identity import Identity
from support import request_worker
from support.waits import wait_until

JOB, SLOT = "export", "2026-02-01T00:00:00+00:00"


def attempt(store: Store, n: int, *, slot: str = SLOT, **options: Any) -> Attempt:
    options.setdefault("lease", 3.0)
    return Attempt(
        store, Identity(job=JOB, slot=slot, attempt=n, owner=f"owner-{n}"), options=Options(**options), heartbeat=0.05,
    )


class Items:
    """Items 0..n-1, ``chunk`` at a time; ``before_chunk(ctx, i)`` runs before each chunk's work."""

    def __init__(self, n: int, chunk: int, before_chunk: Any = None):
        self.n, self.chunk, self.before_chunk = n, chunk, before_chunk
        self.seen: list[int] = []
        self.calls = 0

    def __call__(self, ctx: Any) -> int:
        self.calls += 1
        i = ctx.position or 0
        ctx.total = self.n
        while i < self.n:
            if self.before_chunk is not None:
                self.before_chunk(ctx, i)
            batch = list(range(i, min(i + self.chunk, self.n)))
            self.seen.extend(batch)
            i = batch[-1] + 1
            ctx.checkpoint(i, processed=i)
        return len(self.seen)


def row(store: Store, slot: str = SLOT) -> Any:
    with store.open() as s:
        return s.checkpoints.load(JOB, slot)


def history(store: Store, slot: str = SLOT) -> list[tuple[str, str | None]]:
    with store.open() as s:
        return [(r.outcome, r.requested_by) for r in s.listings.history(JOB, slot)]


def failed_slot(store: Store, at: int = 10) -> None:
    """A slot whose attempt 1 failed after ``at`` items (a checkpoint to resume)."""

    def fail(ctx: Any, i: int) -> None:
        if i == at:
            raise RuntimeError("injected")

    with pytest.raises(RuntimeError):
        attempt(store, 1).run(Items(30, 5, fail))


# -- pause and resume ------------------------------------------------------------------------


def test_a_pause_stops_the_run_at_the_next_chunk_boundary_and_resume_continues_in_the_same_try(store: Store) -> None:
    # Given a run in progress, and a person who pauses it after its second chunk
    def pause_once(ctx: Any, i: int) -> None:
        if i == 10:
            control.pause(store, JOB, SLOT, by="alice")
            wait_until(lambda: ctx.signal.cancelled, "the request to reach the run", timeout=10)  # the lease keeper reads the request (one heartbeat)

    work = Items(30, 5, pause_once)
    # When the run reaches its next checkpoint
    with pytest.raises(Paused) as paused:
        attempt(store, 1).run(work)
    # Then it stopped there with the checkpoint saved, holding no lease
    assert paused.value.reason == "paused" and paused.value.until is None
    r = row(store)
    assert (r.status, r.stop_reason, r.position, r.request, r.lease_owner) == ("paused", "paused", 15, None, None)
    # When bob resumes it and the same try continues
    resumed = control.resume(store, JOB, SLOT, by="bob")
    assert (resumed.status, resumed.request, resumed.requested_by) == ("paused", "resume", "bob")
    outcome = attempt(store, 1).run(work)
    # Then it continued from the checkpoint: every item once, and the history tells who did what
    assert outcome.resumed_from == 15 and outcome.checkpoint.status == "done" and outcome.checkpoint.request is None
    assert sorted(work.seen) == list(range(30))
    assert history(store) == [
        ("paused", None), ("pause_requested", "alice"), ("resume_requested", "bob"), ("done", None),
    ]


def test_a_pause_requested_before_the_attempt_starts_pauses_it_before_any_work(store: Store) -> None:
    # Given a slot whose last attempt failed, paused while nothing runs it
    failed_slot(store)
    assert control.pause(store, JOB, SLOT, by="ops").request == "pause"
    # When its retry starts
    work = Items(30, 5)
    with pytest.raises(Paused, match="pause requested by ops"):
        attempt(store, 2).run(work)
    # Then it paused before the first chunk, at the failed attempt's checkpoint
    assert work.seen == [] and row(store).status == "paused" and row(store).position == 10
    control.resume(store, JOB, SLOT)
    assert attempt(store, 2).run(work).checkpoint.status == "done" and sorted(work.seen) == list(range(10, 30))


def test_a_pause_withdrawn_by_resume_before_the_holder_saw_it_does_not_pause(store: Store) -> None:
    def pause_and_withdraw(ctx: Any, i: int) -> None:
        if i == 10:
            control.pause(store, JOB, SLOT, by="a")
            control.resume(store, JOB, SLOT, by="a")

    work = Items(30, 5, pause_and_withdraw)
    opts = Options(lease=60.0)  # heartbeats every 20 s: the keeper never sees the pause
    outcome = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="o"), options=opts).run(work)
    assert outcome.checkpoint.status == "done" and outcome.checkpoint.request is None


def test_a_resume_that_races_the_pause_leaves_the_paused_slot_asking_to_continue(store: Store) -> None:
    # Given a pause the holder already acted on (its signal fired), and a resume right after
    def pause_then_resume(ctx: Any, i: int) -> None:
        if i == 10:
            control.pause(store, JOB, SLOT, by="a")
            wait_until(lambda: ctx.signal.cancelled, "the request to reach the run", timeout=10)
            control.resume(store, JOB, SLOT, by="b")

    with pytest.raises(Paused):
        attempt(store, 1).run(Items(30, 5, pause_then_resume))
    # Then the slot is paused with the resume pending: whoever waits on it continues at once
    r = row(store)
    assert (r.status, r.request, r.requested_by) == ("paused", "resume", "b")


def test_a_paused_run_counts_as_live_for_the_overlap_policy(store: Store) -> None:
    failed_slot(store)
    control.pause(store, JOB, SLOT)
    with pytest.raises(Paused):
        attempt(store, 2).run(Items(30, 5))
    with pytest.raises(OverlapSkip, match=re.escape(f"slot {SLOT}")):
        attempt(store, 1, slot="2026-02-02T00:00:00+00:00", overlap="skip").run(Items(5, 5))


def test_a_newer_run_with_overlap_replace_cancels_a_paused_earlier_run_as_superseded(store: Store) -> None:
    failed_slot(store)
    control.pause(store, JOB, SLOT)
    with pytest.raises(Paused):
        attempt(store, 2).run(Items(30, 5))
    newer = "2026-02-02T00:00:00+00:00"
    assert attempt(store, 1, slot=newer, overlap="replace").run(Items(5, 5)).checkpoint.status == "done"
    old = row(store)
    assert (old.status, old.stop_reason, old.last_error) == ("cancelled", "superseded", "superseded by a newer run")
    assert control.wake(old, until=None, now=old.updated_at)["event"] == "cancelled"


# -- requests a slot cannot take ------------------------------------------------------------


def unchanged(store: Store, request: Any, match: str) -> None:
    """``request()`` raises RequestRefused matching ``match`` and changes neither row nor history."""
    def still() -> Any:  # the row but for the heartbeat columns, which a live holder moves on
        return dataclasses.replace(row(store), heartbeat_at=None, lease_expires_at=None)

    before, past = still(), history(store)
    with pytest.raises(RequestRefused, match=match) as refused:
        request()
    assert still() == before and history(store) == past
    assert JOB in str(refused.value) and SLOT in str(refused.value)


def test_requests_a_slot_cannot_take_raise_and_change_nothing(store: Store) -> None:
    with pytest.raises(SlotNotFound, match="no checkpoint row"):
        control.pause(store, JOB, "2030-01-01T00:00:00+00:00")
    failed_slot(store)
    unchanged(store, lambda: control.resume(store, JOB, SLOT), "failed, not paused")
    unchanged(store, lambda: control.cancel(store, JOB, SLOT), "nothing to cancel")
    unchanged(store, lambda: control.release(store, JOB, SLOT), "nobody holds")
    control.pause(store, JOB, SLOT)
    unchanged(store, lambda: control.pause(store, JOB, SLOT), "already requested")
    control.resume(store, JOB, SLOT)
    attempt(store, 2).run(Items(30, 5))
    unchanged(store, lambda: control.pause(store, JOB, SLOT), r"finished \(done\).*restart")
    unchanged(store, lambda: control.resume(store, JOB, SLOT), "finished")
    unchanged(store, lambda: control.cancel(store, JOB, SLOT), "finished")
    control.restart(store, JOB, SLOT)
    unchanged(store, lambda: control.restart(store, JOB, SLOT), "already pending")


def test_a_running_slot_cannot_be_restarted_and_its_live_lease_is_released_only_by_force(store: Store) -> None:
    outcomes: dict[str, Any] = {}

    def checks(ctx: Any, i: int) -> None:
        if i == 10:
            unchanged(store, lambda: control.restart(store, JOB, SLOT), "running the slot.*Pause or cancel")
            unchanged(store, lambda: control.release(store, JOB, SLOT), "is alive.*force=True")
            outcomes["released"] = control.release(store, JOB, SLOT, by="ops", force=True)

    with pytest.raises(LeaseLost):  # fenced out: its next checkpoint is refused
        attempt(store, 1).run(Items(30, 5, checks))
    released = outcomes["released"]
    assert released.lease_owner is None and released.position == 10
    assert row(store).position == 10 and ("lease_released", "ops") in history(store)


def test_a_dead_holders_lease_is_released_and_the_next_attempt_takes_over_at_once(store: Store) -> None:
    # Given a holder with an hour's lease that missed its heartbeats for 50 minutes (it died)
    with store.open() as s:
        s.ensure_schema()
        s.leases.acquire(JOB, SLOT, "dead", 3600)
        s.execute(f"UPDATE resumable_checkpoints SET heartbeat_at = {s.d.now_plus('%s')}, "
                  f"lease_expires_at = {s.d.now_plus('%s')}", (-3000, 600))
        s.commit()
    with pytest.raises(LeaseBusy):  # without the release, the next attempt would wait ten minutes
        attempt(store, 2, lease_wait=0).run(Items(10, 5))
    # When someone releases it
    assert control.release(store, JOB, SLOT, by="ops").lease_owner is None
    # Then the next attempt takes the slot at once
    assert attempt(store, 2, lease_wait=0).run(Items(10, 5)).checkpoint.status == "done"


# -- cancel and restart ---------------------------------------------------------------------


def test_cancel_of_a_running_slot_stops_it_as_requested_and_of_a_paused_one_at_once(store: Store) -> None:
    def cancel_once(ctx: Any, i: int) -> None:
        if i == 10:
            assert control.cancel(store, JOB, SLOT, by="carol").cancel_request == "requested"
            wait_until(lambda: ctx.signal.cancelled, "the request to reach the run", timeout=10)

    with pytest.raises(Cancelled) as stopped:
        attempt(store, 1).run(Items(30, 5, cancel_once))
    assert stopped.value.reason == "requested" and not isinstance(stopped.value, Paused)
    assert (row(store).status, row(store).stop_reason, row(store).position) == ("cancelled", "requested", 15)
    # A paused slot has no holder: the cancel is the slot's new status
    control.pause(store, JOB, SLOT)
    with pytest.raises(Paused):
        attempt(store, 2).run(Items(30, 5))
    cancelled = control.cancel(store, JOB, SLOT, by="carol")
    assert (cancelled.status, cancelled.stop_reason, cancelled.last_error) == ("cancelled", "requested", "cancelled by carol")
    assert cancelled.position == 15 and history(store)[-1] == ("cancel_requested", "carol")


def test_a_run_cancelled_on_request_names_who_asked_in_its_last_error_and_history(store: Store) -> None:
    """A person pressing Cancel in the UI is named where the row says why the run stopped, not
    "the control API"; a name with markup in it is kept as it is (the faces escape it)."""
    # Given a running slot, and a person who cancels it (a name with markup, as an auth manager may give)
    who = "<b>dora</b>"

    def cancel_once(ctx: Any, i: int) -> None:
        if i == 10:
            control.cancel(store, JOB, SLOT, by=who)
            wait_until(lambda: ctx.signal.cancelled, "the request to reach the run", timeout=10)

    # When the holder reads the request and stops
    with pytest.raises(Cancelled) as stopped:
        attempt(store, 1).run(Items(30, 5, cancel_once))
    # Then the row's last error, the exception and the attempt's history record name who asked
    assert stopped.value.message == f"cancel requested by {who}"
    assert (row(store).status, row(store).last_error) == ("cancelled", f"cancel requested by {who}")
    with store.open() as s:
        ended = [r for r in s.listings.history(JOB, SLOT) if r.outcome == "cancelled"]
    assert [r.error for r in ended] == [f"cancel requested by {who}"]


def test_restart_makes_the_next_attempt_start_from_the_beginning(store: Store) -> None:
    work = Items(20, 5)
    attempt(store, 1).run(work)
    control.restart(store, JOB, SLOT, by="dave")
    outcome = attempt(store, 2).run(work)
    assert outcome.resumed_from is None and work.seen == list(range(20)) * 2
    assert outcome.checkpoint.runs == 2 and outcome.checkpoint.request is None


# -- throttle and time slices ---------------------------------------------------------------


def test_a_short_throttle_wait_sleeps_between_chunks_and_a_cancel_cuts_it_short(store: Store) -> None:
    asked: list[int] = []

    timer = threading.Timer(0.2, lambda: a.signal.cancel("user"))

    def throttle(ctx: Any) -> float | None:
        asked.append(ctx.processed)
        if ctx.processed < 30:
            return 0.01
        timer.start()  # the cancel comes during the long sleep asked here, whatever the machine's speed
        return 30.0

    a = attempt(store, 1, throttle=throttle, defer_after=60)
    started = time.monotonic()
    with pytest.raises(Cancelled):
        a.run(Items(50, 5))
    timer.cancel()
    assert asked == [5, 10, 15, 20, 25, 30] and time.monotonic() - started < 10
    assert row(store).position == 30


def test_a_long_throttle_wait_pauses_the_run_until_then(store: Store) -> None:
    with pytest.raises(Paused) as paused:
        attempt(store, 1, throttle=lambda ctx: timedelta(minutes=5) if ctx.processed == 10 else None).run(Items(30, 5))
    assert paused.value.reason == "throttled" and paused.value.until is not None
    r = row(store)
    assert (r.status, r.stop_reason, r.position) == ("paused", "throttled", 10)
    waits = (r.resume_at - r.updated_at).total_seconds()
    assert 290 < waits < 310


@pytest.mark.parametrize("answer", [float("nan"), -1, "soon", 10**9])
def test_a_throttle_answer_that_is_not_a_wait_fails_the_attempt_naming_it(store: Store, answer: Any) -> None:
    with pytest.raises(ConfigurationError, match="throttle .* answered") as err:
        attempt(store, 1, throttle=lambda ctx: answer).run(Items(10, 5))
    assert JOB in str(err.value) and row(store).position == 5


def test_max_runtime_pauses_for_an_instant_and_the_next_slice_continues(store: Store) -> None:
    def slow(ctx: Any, i: int) -> None:
        ctx.signal.wait(0.1)

    work = Items(20, 2, slow)
    slices = 0
    while True:
        slices += 1
        try:
            attempt(store, 1, max_runtime=0.25).run(work)
            break
        except Paused as paused:
            assert paused.reason == "time_slice" and row(store).stop_reason == "time_slice"
    assert slices >= 3 and sorted(work.seen) == list(range(20))


def test_options_refuse_a_throttle_that_cannot_take_ctx_and_a_bad_max_runtime() -> None:
    with pytest.raises(ConfigurationError) as err:
        Options(throttle=lambda: None, max_runtime=float("nan"), defer_after=-1)
    text = str(err.value)
    assert "throttle" in text and "max_runtime" in text and "defer_after" in text


# -- what a paused task waits for -----------------------------------------------------------


def test_a_paused_task_wakes_for_resume_restart_cancel_its_time_or_a_clear_and_not_otherwise() -> None:
    from datetime import datetime, timezone

    from airflow_resumable.core.model.checkpoint import Checkpoint

    now = datetime(2026, 2, 1, 12, tzinfo=timezone.utc)
    paused = Checkpoint(job=JOB, slot=SLOT, status="paused", stop_reason="paused", requested_by="ann")

    def event(row: Any, until: Any = None) -> Any:
        found = control.wake(row, until=until, now=now)
        return found and found["event"]

    assert event(paused) is None
    assert event(paused, until=now + timedelta(seconds=1)) is None
    assert event(paused, until=now) == "resumed"
    assert event(dataclasses.replace(paused, request="resume")) == "resumed"
    assert event(dataclasses.replace(paused, request="restart")) == "resumed"
    assert event(dataclasses.replace(paused, request="pause")) is None
    assert event(dataclasses.replace(paused, cancel_request="requested", request="resume")) == "cancelled"
    assert event(dataclasses.replace(paused, status="cancelled")) == "cancelled"
    assert event(dataclasses.replace(paused, status="running")) == "resumed"  # a Clear ran it meanwhile
    assert event(None) == "missing"


# -- requests whose holder died before it saw them ------------------------------------------

def killed_holder(store: Store, request: Any, *, slot: str = SLOT) -> None:
    """Attempt 1 of ``slot`` holds it in its own process; ``request()``; then it is SIGKILLed."""
    request_worker.killed_holder(store, JOB, slot, request)


def test_a_cancel_accepted_before_its_holder_was_killed_ends_the_next_attempt_cancelled_without_running(
    store: Store,
) -> None:
    # Given a cancel the live holder accepted, then the holder killed before it acted on it
    def cancel() -> None:
        assert control.cancel(store, JOB, SLOT, by="carol").cancel_request == "requested"

    killed_holder(store, cancel)
    assert (row(store).status, row(store).cancel_request) == ("running", "requested")
    # When the slot's next attempt (Airflow's retry) takes over
    work = Items(30, 5)
    with pytest.raises(Cancelled) as stopped:
        attempt(store, 2, lease_wait=30).run(work)
    # Then it ends cancelled as the live holder would have, naming who asked, and ran nothing
    assert stopped.value.reason == "requested" and not isinstance(stopped.value, Paused)
    assert "carol" in stopped.value.message and work.calls == 0
    r = row(store)
    assert (r.status, r.stop_reason, r.position, r.cancel_request, r.lease_owner) == (
        "cancelled", "requested", 5, None, None)
    assert "carol" in r.last_error
    assert [o for o, _ in history(store)] == ["running", "cancel_requested", "cancelled"]
    # And it was honoured once: a Clear after it resumes from the checkpoint
    assert attempt(store, 3).run(work).checkpoint.status == "done" and work.seen == list(range(5, 30))


def test_a_pause_accepted_before_its_holder_was_killed_pauses_the_next_attempt_before_any_work(
    store: Store,
) -> None:
    killed_holder(store, lambda: control.pause(store, JOB, SLOT, by="alice"))
    work = Items(30, 5)
    with pytest.raises(Paused, match="pause requested by alice"):
        attempt(store, 2, lease_wait=30).run(work)
    assert work.calls == 0 and (row(store).status, row(store).position) == ("paused", 5)


def test_a_supersede_asked_of_a_holder_that_was_killed_ends_its_retry_as_superseded(store: Store) -> None:
    # Given a newer run (overlap replace) that asked the older slot's holder to stop, which was killed first
    newer = "2026-02-02T00:00:00+00:00"

    def supersede() -> None:
        assert attempt(store, 1, slot=newer, overlap="replace").run(Items(5, 5)).checkpoint.status == "done"
        assert row(store).cancel_request == "superseded"

    killed_holder(store, supersede)
    # When the older slot's retry starts, it stops as superseded (no retry for the operator), running nothing
    work = Items(30, 5)
    with pytest.raises(Cancelled) as stopped:
        attempt(store, 2, lease_wait=30).run(work)
    assert stopped.value.reason == "superseded" and work.calls == 0
    assert (row(store).status, row(store).stop_reason) == ("cancelled", "superseded")


def test_a_cancel_of_a_slot_whose_holder_is_dead_is_honoured_by_its_next_attempt(store: Store) -> None:
    # Given a slot whose holder died with its lease lapsed (its Airflow task is still to be retried)
    failed_slot(store)
    with store.open() as s:
        s.leases.acquire(JOB, SLOT, "dead", 60)
        s.execute("UPDATE resumable_checkpoints SET status = 'running'")
        s.execute(f"UPDATE resumable_checkpoints SET heartbeat_at = {s.d.now_plus('%s')}, "
                  f"lease_expires_at = {s.d.now_plus('%s')}", (-120, -60))
        s.commit()
    # When someone cancels it: it is cancelled at once
    cancelled = control.cancel(store, JOB, SLOT, by="carol")
    assert (cancelled.status, cancelled.lease_owner) == ("cancelled", None)
    # Then the retry of the dead attempt does not run it: it ends cancelled too
    work = Items(30, 5)
    with pytest.raises(Cancelled, match="carol") as stopped:
        attempt(store, 2).run(work)
    assert stopped.value.reason == "requested" and work.calls == 0
    assert (row(store).status, row(store).position, row(store).cancel_request) == ("cancelled", 10, None)
    # And a Clear after that resumes it
    assert attempt(store, 3).run(work).checkpoint.status == "done" and work.seen == list(range(10, 30))
