"""What a run the overlap policy kept from starting tells the person looking at it.

The task log says it in its main part (not in a collapsed group): the run of the job that began
first, its slot and when it started. The same goes to XCom (key ``overlap``), where the Checkpoint
tab finds it: a skipped run leaves no checkpoint row behind to show.
"""

from __future__ import annotations

from typing import Any

from airflow_resumable.core.model.errors import Overlap
from airflow_resumable.core.model.outward import outward_text, outward_traceback

#: XCom key of the overlap decision: ``{"policy", "yielded_to": {"run_id", "slot", "started_at"}, "message"}``.
OVERLAP_XCOM_KEY = "overlap"


def overlap_report(policy: str, exc: Overlap) -> dict[str, Any]:
    """The decision as plain JSON (the XCom value, and the REST API's ``overlap``)."""
    return {"policy": policy, "yielded_to": exc.yielded_to, "message": outward_text(exc.message),
            "job": None if exc.job is None else outward_text(exc.job), "slot": None if exc.slot is None else outward_text(exc.slot)}


def report_overlap(log: Any, ti: Any, policy: str, exc: Overlap) -> None:
    """Log a skip (a wait logs its own line, with the next check) and push the decision to XCom;
    a failed push is logged, never raised."""
    if policy == "skip":
        log.warning("skipped by the overlap policy: %s", outward_text(str(exc)))
    try:
        ti.xcom_push(key=OVERLAP_XCOM_KEY, value=overlap_report(policy, exc))
    except Exception as failed:  # a report channel: the decision stands without it
        log.warning("could not push the overlap decision to XCom: %s", outward_traceback(failed))
