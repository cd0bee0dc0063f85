"""Control requests (airflow_resumable.control) racing the faults: pause (resumed after a while),
cancel, restart; and a deploy (the drain of a worker) while a slot is paused. A refused request is
part of the race (the slot was not in a state to take it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from airflow_resumable.core.errors import RequestRefused, SlotNotFound


def _slot(fault: Any, runs: list[Any]) -> tuple[Any, str]:
    slots = [(run, job) for run in runs for job in run.workload.jobs()]
    return slots[fault.target % len(slots)]


def _wait_for_slot(job: str, slot: str) -> bool:
    """The slot exists once its first attempt started (the run may still be queued)."""
    from airflow_resumable import control

    deadline = time.monotonic() + 60
    while True:
        try:
            control.get(job, slot)
            return True
        except SlotNotFound:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)


def _resume(run: Any, job: str) -> str:
    """Resume a paused slot: refused until the pause took effect (or while it is pending)."""
    from airflow_resumable import control

    deadline = time.monotonic() + 120
    while True:
        try:
            control.resume(job, run.run_id, by="chaos")
            run.requests[job].append("resume")
            return "resumed"
        except (RequestRefused, SlotNotFound) as exc:
            row = control.get(job, run.run_id)
            if row.status not in ("running", "paused") and row.request != "pause":
                return f"slot {row.status} before a resume ({exc.__class__.__name__})"
            if time.monotonic() > deadline:
                return f"resume refused for 120s: {exc}"
        time.sleep(0.5)


def request(chaos: Any, fault: Any, runs: list[Any]) -> str:
    from airflow_resumable import control

    run, job = _slot(fault, runs)
    call = {"pause": control.pause, "cancel": control.cancel, "restart": control.restart}[fault.kind]
    if not _wait_for_slot(job, run.run_id):
        return f"{fault.kind} {job}/{run.run_id}: the slot did not appear in 60s"
    try:
        call(job, run.run_id, by="chaos")
    except (RequestRefused, SlotNotFound) as exc:
        return f"{fault.kind} {job}/{run.run_id}: refused ({type(exc).__name__})"
    run.requests.setdefault(job, []).append(fault.kind)
    if fault.kind != "pause":
        return f"{fault.kind} {job}/{run.run_id}: taken"
    time.sleep(fault.hold)  # how long the pause lasts (the fault itself, not a wait for a condition)
    return f"pause {job}/{run.run_id}: taken, after {fault.hold:.0f}s: {_resume(run, job)}"


def deploy_while_paused(chaos: Any, fault: Any, runs: list[Any], deploy: Callable[[], str]) -> str:
    """Pause a slot, wait until it is paused (its task deferred: no worker holds it), drain and
    restart a worker (``deploy``), then resume the slot: it continues on whichever worker takes it."""
    from airflow_resumable import control

    run, job = _slot(fault, runs)
    if not _wait_for_slot(job, run.run_id):
        return f"deploy_paused {job}/{run.run_id}: the slot did not appear in 60s"
    try:
        control.pause(job, run.run_id, by="chaos")
    except (RequestRefused, SlotNotFound) as exc:
        return f"deploy_paused {job}/{run.run_id}: pause refused ({type(exc).__name__})"
    run.requests.setdefault(job, []).append("pause")
    deadline = time.monotonic() + 60
    while (row := control.get(job, run.run_id)).status != "paused":
        if row.status not in ("running", "pending") and row.request != "pause" or time.monotonic() > deadline:
            return f"deploy_paused {job}/{run.run_id}: not paused (slot {row.status}): {_resume(run, job)}"
        time.sleep(0.2)
    drained = deploy()
    return f"deploy_paused {job}/{run.run_id}: paused, {drained}, {_resume(run, job)}"
