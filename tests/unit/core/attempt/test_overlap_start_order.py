"""Two starters of one job, interleaved on purpose: A checks the overlap (nothing live), B takes its
lease, A starts its run, B checks. B must see A as the earlier run and yield: A's run began when its
lease was taken, before its check, not when its start was written after it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from airflow_resumable.core.attempt import runner
from airflow_resumable.core.attempt.runner import Attempt, Identity, Options
from airflow_resumable.core.model.errors import OverlapSkip
from airflow_resumable.core.stores.leases import Leases
from airflow_resumable.core.stores.listings import Listings

WAIT = 3.0


@pytest.mark.parametrize("first", ["new", "retry without progress"])
def test_a_starter_that_checks_after_another_started_yields_to_it(store: Any, first: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        if first != "new":  # A's slot has a row: an earlier attempt took its lease and died before any checkpoint
            taken = s.leases.acquire("j", "a", "dead", 30)
            s.execute("UPDATE resumable_checkpoints SET lease_expires_at = lease_acquired_at WHERE slot = 'a'")
            assert taken is not None
    checked, created, started = threading.Event(), threading.Event(), threading.Event()
    begin, acquire, live_others = runner.begin, Leases.acquire, Listings.live_others

    def slow_begin(given: Any, held: Any, why: Any) -> Any:
        if given.slot == "a":  # A checked, found nothing live; B takes its lease before A's start is written
            checked.set()
            created.wait(WAIT)
        try:
            return begin(given, held, why)
        finally:
            started.set() if given.slot == "a" else None

    def late_acquire(self: Leases, job: str, slot: str, *a: Any, **k: Any) -> Any:
        if slot == "b":
            checked.wait(WAIT)
        try:
            return acquire(self, job, slot, *a, **k)
        finally:
            created.set() if slot == "b" else None

    def late_check(self: Listings, job: str, slot: str) -> Any:
        if slot == "b":
            started.wait(WAIT)
        return live_others(self, job, slot)

    monkeypatch.setattr(runner, "begin", slow_begin)
    monkeypatch.setattr(Leases, "acquire", late_acquire)
    monkeypatch.setattr(Listings, "live_others", late_check)
    ran: list[str] = []
    out: dict[str, Any] = {}

    def go(slot: str) -> None:
        try:
            Attempt(store, Identity(job="j", slot=slot, attempt=2, owner=f"o-{slot}"),
                    options=Options(overlap="skip", lease=30)).run(lambda ctx: (ran.append(slot), hold.wait(4 * WAIT)))
            out[slot] = "ran"
        except OverlapSkip:
            out[slot] = "skipped"
        except BaseException as exc:
            out[slot] = exc

    hold = threading.Event()
    threads = [threading.Thread(target=go, args=(s,)) for s in ("a", "b")]
    for t in threads:
        t.start()
    # B decided (skip), or both handlers run: either way the decisions are made before A's handler ends
    for _ in range(int(WAIT * 80)):  # up to 4 * WAIT: a wait above may run out (the one-statement start)
        if "b" in out or len(ran) == 2:
            break
        threading.Event().wait(0.05)
    both = sorted(ran)
    hold.set()
    for t in threads:
        t.join(4 * WAIT)
    assert both == ["a"], f"handlers ran on {both} at once: {out}"
    assert out == {"a": "ran", "b": "skipped"}
