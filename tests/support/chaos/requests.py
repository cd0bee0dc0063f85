"""Control requests (airflow_resumable.control) as faults: pause (resumed a while after it took
effect), cancel, restart (of a paused slot). A refused request is noted: the fault then proved
nothing (its verdict says so)."""

from __future__ import annotations

import time
from contextlib import closing
from typing import Any

from airflow_resumable.core.model.errors import RequestRefused, SlotNotFound
from support.chaos.moments import Victim, holds
from support.chaos.workloads import Run


def ask(run: Run, job: str, kind: str) -> str:
    """Make the request ``kind`` (pause, resume, cancel, restart) to the slot: ``taken`` or why not."""
    from airflow_resumable import control

    call = {"pause": control.pause, "resume": control.resume, "cancel": control.cancel,
            "restart": control.restart}[kind]
    try:
        call(job, run.run_id, by="chaos")
    except (RequestRefused, SlotNotFound) as exc:
        return f"{kind} refused ({type(exc).__name__}: {exc})"[:300]
    run.requests.setdefault(job, []).append(kind)
    return "taken"


def wait_paused(chaos: Any, run: Run, job: str, *, deadline: float) -> tuple[Victim | None, str]:
    """Wait until the slot is paused (its attempt stopped at a chunk boundary; its task defers):
    the paused attempt, or None and what the slot did instead."""
    from airflow_resumable import control

    seen = "?"
    while time.monotonic() < deadline:
        try:
            with closing(chaos.connect()) as conn, conn.cursor() as cur:
                paused = holds(cur, "paused", run, job, 0)
            if paused is not None:
                return paused, ""
            r = control.get(job, run.run_id)
            seen = f"{r.status}, request {r.request}"
            if r.status == "done" or (r.status, r.stop_reason) == ("cancelled", "requested"):
                return None, f"the slot ended {r.status} first"
        except Exception as exc:  # noqa: BLE001 - a database restarting: not paused yet
            seen = repr(exc)[:200]
        time.sleep(0.2)
    return None, f"not paused in time ({seen})"


def resume(run: Run, job: str) -> str:
    """Resume a paused slot: refused until the pause took effect (or while it is pending)."""
    from airflow_resumable import control

    deadline = time.monotonic() + 120
    while True:
        try:
            control.resume(job, run.run_id, by="chaos")
            run.requests.setdefault(job, []).append("resume")
            return "resumed"
        except (RequestRefused, SlotNotFound) as exc:
            why = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - a database restarting: try again
            why = repr(exc)
        try:
            r = control.get(job, run.run_id)
            if r.status not in ("running", "paused") and r.request != "pause":
                return f"slot {r.status} before a resume ({why})"[:300]
        except Exception:  # noqa: BLE001, S110 - a database restarting: try again
            pass
        if time.monotonic() > deadline:
            return f"resume refused for 120s: {why}"[:300]
        time.sleep(0.5)
