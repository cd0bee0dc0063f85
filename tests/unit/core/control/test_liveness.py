"""A slot's status never outlives the attempt behind it: one rule (core/view.py ``liveness_of``)
says how a slot is shown, and a job's line, its partitions and a slot's detail all take it.

The core's rule on rows built by hand; then real rows of both stores, read as the jobs list and as
each slot's detail, for running, stalled, abandoned, paused and handover-pending slots; the
requests an abandoned slot takes (judged by the write, on the lease's expiry); and a holder killed
with SIGKILL, as ``airflow resumable show`` prints it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import SQLiteStore
from airflow_resumable.core.control import requests as core_control
from airflow_resumable.core.model.checkpoint import Checkpoint
from airflow_resumable.core.model.errors import RequestRefused
from airflow_resumable.core.model.request_rules import Action
from airflow_resumable.core.stores import Store
from airflow_resumable.core.view import liveness_of, row_view, slot_detail
from support.module_cli import run_module_cli
from support.slots import SLOT, run_slot

T0 = datetime(2026, 3, 1, 12, tzinfo=timezone.utc)
OWNER = "ti-1/try1@host-9:4242"


def _row(**values: Any) -> Checkpoint:
    base: dict[str, Any] = {"job": "j", "slot": "s", "status": "running", "processed": 600, "total": 1000,
                            "rate": 20.0, "lease_owner": OWNER, "lease_token": 1, "heartbeat_at": T0,
                            "lease_expires_at": T0 + timedelta(seconds=30), "updated_at": T0, "attempt": 1}
    return Checkpoint(**{**base, **values})


# -- the rule -------------------------------------------------------------------------------------


def test_a_running_row_is_shown_as_its_holder_stands_running_stalled_or_abandoned() -> None:
    # A holder that heartbeats and keeps to its rate: running, its ETA counting down
    shown = liveness_of(_row(), T0 + timedelta(seconds=5))
    assert (shown.shown, shown.rate, shown.eta, shown.since) == ("running", 20.0, 15.0, None)
    # Past its ETA with no checkpoint, the lease live: stalled since the last checkpoint, no ETA
    late = _row(heartbeat_at=T0 + timedelta(seconds=25), lease_expires_at=T0 + timedelta(seconds=55))
    shown = liveness_of(late, T0 + timedelta(seconds=25))
    assert (shown.shown, shown.since, shown.eta, shown.last_holder) == ("stalled", T0, None, OWNER)
    # A holder that missed two heartbeats, its lease not lapsed: stalled since its last heartbeat
    shown = liveness_of(_row(), T0 + timedelta(seconds=21))
    assert (shown.shown, shown.since) == ("stalled", T0) and "missed two heartbeats" in (shown.why or "")
    # Its lease lapsed: abandoned since the expiry, naming the last holder
    shown = liveness_of(_row(), T0 + timedelta(seconds=31))
    assert (shown.shown, shown.since, shown.last_holder) == ("abandoned", T0 + timedelta(seconds=30), OWNER)
    assert shown.why and "nobody runs this slot" in shown.why and OWNER in shown.why
    assert (shown.rate, shown.eta) == (None, None)
    # Its lease released (no holder named): abandoned since the last heartbeat, the try named
    shown = liveness_of(_row(lease_owner=None, lease_expires_at=None), T0 + timedelta(seconds=1))
    assert (shown.shown, shown.since, shown.last_holder) == ("abandoned", T0, "try 1")
    # Airflow says its task instance ended: abandoned, whatever the lease says
    shown = liveness_of(_row(), T0 + timedelta(seconds=1), ti_state="failed")
    assert shown.shown == "abandoned" and "task instance is failed" in (shown.why or "")
    assert liveness_of(_row(), T0 + timedelta(seconds=1), ti_state="running").shown == "running"
    # Any other status is shown as it is stored
    for status in ("paused", "done", "failed", "cancelled"):
        assert liveness_of(_row(status=status), T0 + timedelta(hours=1)).shown == status


def test_an_abandoned_slots_detail_offers_no_pause_and_says_why_in_every_field() -> None:
    view = slot_detail(_row(), history=[], offers={"pause": True, "restart": False, "release": False},
                       notes={"pause": "The run stops at its next chunk boundary"}, now=T0 + timedelta(seconds=1),
                       ti_state="failed")
    assert (view["status"], view["shown_status"], view["last_holder"]) == ("running", "abandoned", OWNER)
    assert view["live"] is False and view["offers"]["pause"] is False
    assert view["offer_notes"]["pause"].startswith("Not now: nobody runs this slot")
    assert "Clear its task instance" in view["offer_notes"]["pause"]
    expired = row_view(_row(), now=T0 + timedelta(minutes=3))
    assert (expired["shown_status"], expired["shown_since"], expired["lease"]) == (
        "abandoned", (T0 + timedelta(seconds=30)).isoformat(), "expired")


# -- the line and the detail agree, on real rows ------------------------------------------------------


def _set(store: Store, job: str, sets: str, **values: Any) -> None:
    with store.open(autocommit=True) as s:
        with s.transaction():
            s.execute(f"UPDATE resumable_checkpoints SET {sets} WHERE job = %(job)s AND slot = %(slot)s",
                      {**values, "job": job, "slot": SLOT})


def _make(store: Store, kind: str) -> None:
    """One job ``d.<kind>`` of one slot, its row as an attempt in that state leaves it."""
    job = f"d.{kind}"
    run_slot(store, job, "d", task_id=kind, n=1000, fail_at=600)
    with store.open(autocommit=True) as s:
        now = s.d.now()
        live = f"lease_owner = '{OWNER}', lease_expires_at = {s.d.now_plus('3600')}, heartbeat_at = {now}"
        sets = {
            # a holder that heartbeats, 400 items left at 20/s: 20 s to go
            "running": f"status = 'running', rate = 20.0, updated_at = {now}, {live}",
            # its last checkpoint an hour ago, with 20 s to go then
            "stalled": f"status = 'running', rate = 20.0, updated_at = {s.d.now_plus('-3600')}, {live}",
            # its holder killed: its lease lapsed a minute ago
            "abandoned": f"status = 'running', rate = 20.0, lease_owner = '{OWNER}', "
                         f"lease_expires_at = {s.d.now_plus('-60')}, heartbeat_at = {s.d.now_plus('-90')}",
            "paused": "status = 'paused', lease_owner = NULL, lease_expires_at = NULL",
            # a newer try asked this holder to hand the slot over: it still runs until its next chunk boundary
            "handover": f"status = 'running', rate = 20.0, cancel_request = 'handover', updated_at = {now}, {live}",
        }[kind]
    _set(store, job, sets)


@pytest.mark.parametrize("kind", ["running", "stalled", "abandoned", "paused", "handover"])
def test_a_jobs_line_and_its_slots_detail_show_the_same_status_rate_eta_and_stall(store: Store, kind: str) -> None:
    # Given a job of one slot in that state
    _make(store, kind)
    # When the jobs are listed and the slot is read whole
    line = next(j for j in core_control.jobs(store) if j["job"] == f"d.{kind}")
    with store.open(autocommit=True) as s:
        row = s.checkpoints.load(f"d.{kind}", SLOT)
    assert row is not None
    detail = row_view(row, now=core_control.now_of(row))
    # Then the line counts the slot as its detail shows it, with the same figures
    shown = {"handover": "running"}.get(kind, kind)
    assert detail["shown_status"] == shown, detail
    assert {k: v for k, v in line["partitions"].items() if v} == {shown: 1, "total": 1}, line
    assert (line["rate"], line["stalled_since"]) == (detail["rate"], detail["stalled_since"]), (line, detail)
    if detail["eta_seconds"] is None:
        assert line["eta_seconds"] is None, line
    else:  # read a moment apart, both counting down from the same checkpoint
        assert line["eta_seconds"] is not None and abs(line["eta_seconds"] - detail["eta_seconds"]) <= 0.5
    if kind == "abandoned":
        assert line["abandoned_since"] == detail["shown_since"] and detail["last_holder"] == OWNER
    if kind in ("stalled", "abandoned"):
        assert line["eta_seconds"] is None, "no ETA for a slot that does not move"
    if kind == "abandoned":
        assert line["rate"] is None, "no rate for a slot nobody runs"


def test_a_mapped_jobs_line_counts_each_running_partition_as_it_is_shown(store: Store) -> None:
    # Given a mapped job: one partition running, one whose holder was killed, one done
    for i in range(3):
        run_slot(store, f"d.m[{i}]", "d", task_id="m", map_index=i, n=1000, fail_at=None if i == 2 else 600)
    with store.open(autocommit=True) as s:
        now = s.d.now()
        _set(store, "d.m[0]", f"status = 'running', rate = 10.0, updated_at = {now}, lease_owner = 'w0', "
             f"lease_expires_at = {s.d.now_plus('3600')}, heartbeat_at = {now}")
        _set(store, "d.m[1]", f"status = 'running', rate = 30.0, lease_owner = 'w1', "
             f"lease_expires_at = {s.d.now_plus('-5')}, heartbeat_at = {s.d.now_plus('-30')}")
    # When the jobs are listed
    line = next(j for j in core_control.jobs(store) if j["job"] == "d.m")
    # Then "1 running, 1 abandoned, 1 done": the dead one neither counts as running nor adds its rate
    assert {k: v for k, v in line["partitions"].items() if v} == {"running": 1, "abandoned": 1, "done": 1, "total": 3}
    assert line["rate"] == 10.0 and line["eta_seconds"] is not None


# -- what an abandoned slot takes ---------------------------------------------------------------------


def test_an_abandoned_slot_refuses_pause_saying_why_and_takes_restart_fencing_its_old_holder(store: Store) -> None:
    _make(store, "abandoned")
    job = "d.abandoned"
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        assert s.requests.offers(job, SLOT) == {"pause": False, "resume": False, "cancel": True, "restart": True,
                                               "release": True}
    # Pause: refused, saying nobody runs it and what to do
    with pytest.raises(RequestRefused, match="nobody runs this slot: its lease expired at .* \\(last holder "
                       + OWNER.replace(".", "\\.") + "\\)") as refused:
        core_control.pause(store, job, SLOT, by="alice")
    assert "Restart it, or Clear its task instance" in (refused.value.hint or "")
    # Restart: taken, the old holder fenced out (its next write matches nothing)
    with store.open() as s:
        before = s.checkpoints.load(job, SLOT)
    assert before is not None
    after = core_control.restart(store, job, SLOT, by="alice")
    assert (after.request, after.lease_owner, after.lease_token) == ("restart", None, before.lease_token + 1)


def test_a_restart_of_a_running_slot_whose_lease_the_database_holds_live_is_refused(store: Store) -> None:
    """Judged in the write by the database's clock: a lease live there is never raced, whatever
    this process's clock says."""
    _make(store, "running")
    with pytest.raises(RequestRefused, match="an attempt is running the slot"):
        core_control.restart(store, "d.running", SLOT, by="alice")
    with store.open(autocommit=True) as s:
        row = s.checkpoints.load("d.running", SLOT)
        assert row is not None and row.request is None and row.lease_owner == OWNER
        # The SQL of the rule names the expiry against the database's now
        from airflow_resumable.core.model.request_rules import sql_where
        assert "lease_expires_at <=" in sql_where(Action.RESTART, "NOW()")


# -- a holder killed with SIGKILL -------------------------------------------------------------------

_HOLDER = """
import sys, time
from airflow_resumable.core import Attempt, Options, SQLiteStore
from airflow_resumable.core.model.identity import Identity

def work(ctx):
    ctx.total = 1000
    ctx.checkpoint(10, processed=10)
    print("holding", flush=True)
    time.sleep(600)

Attempt(SQLiteStore(sys.argv[1]), Identity(job="j.killed", slot="s", attempt=1, owner="victim@host:1"),
        options=Options(lease=3.0), heartbeat=0.2).run(work)
"""


def test_a_holder_killed_with_sigkill_is_shown_abandoned_by_show_once_its_lease_lapses(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "checkpoints.db"
    with SQLiteStore(path).open() as s:
        s.ensure_schema()
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", f"sqlite:///{path}")
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
    finally:
        if holder.poll() is None:
            holder.kill()

    def show(output: str = "json") -> str:
        assert run_module_cli(["show", "j.killed", "s", "--output", output]) == 0
        return capsys.readouterr().out

    # Until its 3 s lease lapses it may still be shown running; then, by a deadline, abandoned
    deadline = time.monotonic() + 30
    view = json.loads(show())
    while view["shown_status"] != "abandoned" and time.monotonic() < deadline:
        time.sleep(0.2)
        view = json.loads(show())
    assert (view["status"], view["shown_status"], view["last_holder"]) == ("running", "abandoned", "victim@host:1")
    assert view["offers"]["pause"] is False and view["offers"]["restart"] is True
    assert view["rate"] is None and view["eta_seconds"] is None


def test_a_listing_shows_a_paused_slot_whose_task_instance_ended_abandoned_as_its_detail_does() -> None:
    from airflow_resumable import control

    # A paused partition whose task instance a person marked failed (or whose pause_timeout ended
    # its last try): its detail and the job's line say nobody waits for a resume
    paused = _row(job="j[0]", status="paused", lease_owner=None, lease_expires_at=None, dag_id="d", task_id="t",
                  run_id="r", map_index=0)
    running = _row(job="j[1]", dag_id="d", task_id="t", run_id="r", map_index=1)
    asked: list[tuple[Any, ...]] = []

    def states(*key: Any) -> dict[int, str]:
        asked.append(key)
        return {0: "failed", 1: "failed"}

    detail = slot_detail(paused, history=[], offers={"resume": True}, ti_state="failed")
    assert detail["shown_status"] == "abandoned"
    listed = control.listed([paused, running], states)
    # The listing (airflow resumable list, GET /api/v1/checkpoints) shows both as their details do
    assert [(r["job"], r["status"], r["shown_status"]) for r in listed] == [
        ("j[0]", "paused", "abandoned"), ("j[1]", "running", "abandoned")], listed
    assert asked == [("d", "t", "r")], "Airflow is asked once for the task of a run"
    # A paused slot whose try waits for a retry still waits for its resume
    assert [r["shown_status"] for r in control.listed([paused], lambda *_: {0: "up_for_retry"})] == ["paused"]
