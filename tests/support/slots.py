"""Checkpoint rows made by real attempts, owned by a task instance of a named DAG (the REST API,
CLI and UI tests read and steer them)."""

from __future__ import annotations

from typing import Any

from airflow_resumable.core import Attempt, Options, Store
from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.identity import Identity

SLOT = "2026-02-01T00:00:00+00:00"


def run_slot(store: Store, job: str, dag_id: str, *, fail_at: int | None = None, n: int = 30, slot: str = SLOT,
             run_id: str = "run_1", task_id: str = "export", map_index: int = -1) -> None:
    """One attempt of ``job`` for ``dag_id``'s task instance: done, or failed after ``fail_at`` of ``n`` items."""

    def handler(ctx: Any) -> None:
        ctx.total = n
        i = ctx.position or 0
        while i < n:
            if i == fail_at:
                raise RuntimeError("injected")
            i += 5
            ctx.checkpoint(i, processed=i)

    attempt = Attempt(
        store,
        Identity(job=job, slot=slot, attempt=1, owner="owner-1", origin=Origin(dag_id=dag_id, task_id=task_id, run_id=run_id, map_index=map_index)),
        options=Options(lease=3.0), heartbeat=0.05,
    )
    try:
        attempt.run(handler)
    except RuntimeError:
        pass
