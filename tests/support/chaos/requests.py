"""Control requests (airflow_resumable.control) racing the faults: pause (resumed after a while),
cancel, restart. A refused request is part of the race (the slot was not in a state to take it)."""

from __future__ import annotations

import time
from typing import Any

from airflow_resumable.core.errors import RequestRefused, SlotNotFound


def request(chaos: Any, fault: Any, runs: list[Any]) -> str:
    from airflow_resumable import control

    slots = [(run, job) for run in runs for job in run.workload.jobs()]
    run, job = slots[fault.target % len(slots)]
    call = {"pause": control.pause, "cancel": control.cancel, "restart": control.restart}[fault.kind]
    deadline = time.monotonic() + 60
    while True:  # the slot exists once its first attempt started (the run may still be queued)
        try:
            control.get(job, run.run_id)
            break
        except SlotNotFound:
            if time.monotonic() > deadline:
                return f"{fault.kind} {job}/{run.run_id}: the slot did not appear in 60s"
            time.sleep(0.2)
    try:
        call(job, run.run_id, by="chaos")
    except (RequestRefused, SlotNotFound) as exc:
        return f"{fault.kind} {job}/{run.run_id}: refused ({type(exc).__name__})"
    run.requests.setdefault(job, []).append(fault.kind)
    if fault.kind != "pause":
        return f"{fault.kind} {job}/{run.run_id}: taken"
    time.sleep(fault.hold)  # how long the pause lasts (the fault itself, not a wait for a condition)
    deadline = time.monotonic() + 120
    while True:  # resume is refused until the pause took effect or while it is still pending elsewhere
        try:
            control.resume(job, run.run_id, by="chaos")
            run.requests[job].append("resume")
            return f"pause {job}/{run.run_id}: taken, resumed after {fault.hold:.0f}s"
        except (RequestRefused, SlotNotFound) as exc:
            row = control.get(job, run.run_id)
            if row.status not in ("running", "paused") and row.request != "pause":
                return f"pause {job}/{run.run_id}: taken, slot {row.status} before a resume ({exc.__class__.__name__})"
            if time.monotonic() > deadline:
                return f"pause {job}/{run.run_id}: taken, resume refused for 120s: {exc}"
        time.sleep(0.5)
