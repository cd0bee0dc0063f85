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


#: Where :func:`split_job`'s split cut partition [1]'s range, and when it was agreed.
SPLIT_AT, SPLIT_WHEN = 15, "2026-02-01T00:05:00+00:00"


def hold(store: Store, job: str, *, slot: str = SLOT, **values: Any) -> None:
    """Put ``job``'s row as a live attempt holds it mid-run: ``running``, its lease live for an
    hour, with ``values`` (``processed=3``) set too."""
    with store.open(autocommit=True) as s, s.transaction():
        sets = ", ".join([f"{k} = %({k})s" for k in values] + [
            "status = 'running'", "lease_owner = 'w2'", f"lease_expires_at = {s.d.now_plus('3600')}",
            f"heartbeat_at = {s.d.now()}"])
        s.execute(f"UPDATE resumable_checkpoints SET {sets} WHERE job = %(job)s AND slot = %(slot)s",
                  {**values, "job": job, "slot": slot})


def split_job(store: Store, job: str, dag_id: str, *, own: str, taken: str | None, by: str | None = None,
              task_id: str = "exp.partition") -> None:
    """A partitioned job of 3 partitions of 10 rows (plan cut at keys 10 and 20), whose partition
    [2], done with its own range, took the upper half of what [1] had left (split 1, at key
    :data:`SPLIT_AT`, asked by ``by``, default ``<job>[2]``): [0] and [2] done 10/10; [1] (its range
    now up to the cut: 5 rows) ``own``: ``done`` 5/5 or ``running`` at 3/5; the taken range
    ``<job>[1].1``, run by [2]'s task instance (map index 2), ``taken``: ``done`` 5/5, ``running``
    at 2/5, or None (no row: its taker died before it started)."""
    from airflow_resumable.core.work.partitions import Plan, save_plan

    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, job, SLOT, Plan(3, (10, 20), 30).with_split(of="1", at=SPLIT_AT, by=by or f"{job}[2]",
                                                                  when=SPLIT_WHEN))
    for i, n in ((0, 10), (1, 5), (2, 10)):
        run_slot(store, f"{job}[{i}]", dag_id, task_id=task_id, map_index=i, n=n)
    if own == "running":
        hold(store, f"{job}[1]", processed=3)
    if taken is not None:
        run_slot(store, f"{job}[1].1", dag_id, task_id=task_id, map_index=2, n=5)
        if taken == "running":
            hold(store, f"{job}[1].1", processed=2)
