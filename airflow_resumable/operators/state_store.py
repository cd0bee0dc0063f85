"""A small summary of the slot in Airflow's own task state store (Airflow 3.3, AIP-103), the first
sub-tab of a task instance's **Storage** tab: where a person looks first.

Key ``resumable``: ``{"job", "slot", "status", "position", "processed", "total", "percent",
"updated_at", "checkpoint_tab"}`` (made by ``airflow_resumable.core.view.state_store_summary``: a position over
512 characters of JSON as a preview marked ``truncated``), the last a link to the task instance's Checkpoint tab in the
Airflow UI (the whole row, live). Written at the pace of the XCom push (``xcom_interval``), never per checkpoint: one
write goes through the supervisor and the Execution API (about 17 ms here). Where the running
Airflow has no task state store, or a write fails, it says so once in the log and stops trying;
the work never fails over it.

The summary is a copy, written and never read: the checkpoint lives in the checkpoint store, not in
the task state store, and decides alone where an attempt starts. So Airflow's next release, whose
Clear of a task instance discards its task state store entries unless ``keep_task_state`` is set
(apache/airflow newsfragment 72100), changes nothing in what a resumable task does: the summary is
gone until the next attempt writes it again, and a Clear of a failed task still resumes from the
checkpoint, a Clear of a succeeded task still starts the slot over on purpose (both with or without
``keep_task_state``; see docs/explanation/airflow.md). A test pins it (tests/unit/operators/test_state_store.py).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from airflow_resumable.core.model.checkpoint import Checkpoint
from airflow_resumable.core.model.outward import outward_traceback
from airflow_resumable.core.view import STATE_STORE_POSITION_LIMIT, state_store_summary

#: The task state store's key of the summary.
STATE_KEY = "resumable"
#: A position longer than this, as JSON, is shown cut (the whole one is in the checkpoint row).
POSITION_LIMIT = STATE_STORE_POSITION_LIMIT


def checkpoint_tab(ti: Any) -> str:
    """The task instance's Checkpoint tab in the Airflow UI (its own route: the task instance's
    page with the tab open, not the bare plugin page), under ``[api] base_url`` when set."""
    from airflow_resumable.version_compat import conf

    base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    map_index = getattr(ti, "map_index", -1)
    mapped = f"/mapped/{int(map_index)}" if map_index is not None and int(map_index) >= 0 else ""
    path = "/".join(("dags", quote(ti.dag_id, safe=""), "runs", quote(ti.run_id, safe=""), "tasks",
                     quote(ti.task_id, safe="")))
    return f"{base}/{path}{mapped}/plugin/checkpoint"


class StateStoreMirror:
    """Writes the summary to ``context["task_state_store"]``; a no-op (logged once) without one."""

    def __init__(self, log: Any, ti: Any, store: Any | None):
        self.log = log
        self.store = store
        self.link = checkpoint_tab(ti)
        if store is None:
            log.info("this Airflow has no task state store (Airflow 3.3+): the checkpoint summary goes to XCom "
                     "only (key 'checkpoint')")

    def write(self, cp: Checkpoint) -> None:
        if self.store is None:
            return
        try:
            self.store.set(STATE_KEY, self.summary(cp))
        except Exception as failed:  # a report channel: never fail the work over it
            self.log.warning("could not write the checkpoint summary to Airflow's task state store; it goes to "
                             "XCom only from now on: %s", outward_traceback(failed))
            self.store = None

    def summary(self, cp: Checkpoint) -> dict[str, Any]:
        """The summary written (:func:`airflow_resumable.core.view.state_store_summary`)."""
        return state_store_summary(cp, link=self.link)
