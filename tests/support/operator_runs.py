"""What the operators' tests share (tests/unit/operators/): the DAG runs' day and slot, the items a
test DAG saw, a run's task instance and a slot's checkpoint row, a handler that does nothing.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from airflow_resumable.core.stores import Store

DAY = datetime(2026, 3, 1, tzinfo=timezone.utc)
SLOT = DAY.isoformat()


def seen(path: Path, part: int | None = None) -> list[tuple[int, int]]:
    with sqlite3.connect(path) as db:
        q = "SELECT item, attempt FROM seen" + ("" if part is None else f" WHERE part = {part}")
        return db.execute(q + " ORDER BY rowid").fetchall()


def ti_of(run: Any, task_id: str, map_index: int = -1) -> Any:
    return run.get_task_instance(task_id, map_index=map_index)


def row_of(store: Store, job: str, slot: str = SLOT) -> Any:
    with store.open() as s:
        return s.checkpoints.load(job, slot)


def _noop(ctx: Any) -> None:
    return None
